"""Chat Completions adapter against `openai.types.chat` types.

Well-formed responses are built with `ChatCompletion.model_validate` and
serialised with the SDK's `to_dict()`. A malformed envelope cannot be built by
the SDK (it refuses to validate one), so those start from an SDK-built dict and
corrupt exactly one field.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from adapter_testkit import (
    LONG_TOOL_NAME,
    SERVER_CONTEXT,
    Call,
    admit_call,
    assert_keys_within,
    failed,
    json_text,
    make_registry,
    openai_chat_response,
    succeeded,
    validate_typed,
)
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionFunctionTool,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
)

from executor.core.admission import Rejected, exposed_to
from executor.core.types import ErrorCode, ProposedCall
from executor.providers import openai_chat
from executor.providers.common import AdapterError, AdapterErrorCode, encode_tool_name

ADAPTER_TESTS = Path(__file__).resolve().parent
ROOT = ADAPTER_TESTS.parents[2]
WEATHER_ARGS = '{"city": "Zürich" ,"unit":"c"}'


def _refused(response: dict[str, Any]) -> AdapterErrorCode:
    with pytest.raises(AdapterError) as excinfo:
        openai_chat.read_proposals(response)
    assert excinfo.value.surface == "openai-chat"
    return excinfo.value.code


# ---------------------------------------------------------------- reading


def test_read__tool_calls__neutral_calls_in_model_order_with_raw_argument_text() -> None:
    response = openai_chat_response(
        [Call("call_b", "get_weather", WEATHER_ARGS), Call("call_a", "refund", "")]
    )

    proposals = openai_chat.read_proposals(response)

    assert proposals == [
        ProposedCall(call_id="call_b", tool_name="get_weather", arguments=WEATHER_ARGS),
        ProposedCall(call_id="call_a", tool_name="refund", arguments=""),
    ]


def test_read__final_answer__no_calls() -> None:
    response = openai_chat_response([], finish_reason="stop", content="It is sunny.")
    assert openai_chat.read_proposals(response) == []


@pytest.mark.parametrize("tool_calls", [None, []])
def test_read__tool_calls_finish_without_calls__refused(tool_calls: list[Any] | None) -> None:
    response = openai_chat_response([], finish_reason="tool_calls")
    response["choices"][0]["message"]["tool_calls"] = tool_calls
    assert _refused(response) is AdapterErrorCode.TOOL_CALLS_WITHOUT_CALLS


def test_read__calls_with_stop_finish__still_read() -> None:
    # Some models report "stop" when a call was forced by tool_choice.
    response = openai_chat_response([Call("c1", "get_weather", "{}")], finish_reason="stop")
    assert [p.call_id for p in openai_chat.read_proposals(response)] == ["c1"]


def _corrupt(mutate: Any) -> dict[str, Any]:
    response = openai_chat_response([Call("c1", "get_weather", "{}")])
    mutate(response["choices"][0]["message"])
    return response


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda m: m.update(tool_calls={"id": "c1"}), id="list-is-object"),
        pytest.param(lambda m: m["tool_calls"].append("c2"), id="entry-not-object"),
        pytest.param(lambda m: m["tool_calls"][0].pop("function"), id="no-function"),
        pytest.param(lambda m: m["tool_calls"][0].pop("type"), id="no-type"),
        pytest.param(lambda m: m["tool_calls"][0].pop("id"), id="no-id"),
        pytest.param(lambda m: m["tool_calls"][0]["function"].pop("name"), id="no-name"),
        pytest.param(
            lambda m: m["tool_calls"][0]["function"].update(arguments={"city": "x"}),
            id="arguments-object-not-text",
        ),
    ],
)
def test_read__malformed_call_list__refused(mutate: Any) -> None:
    assert _refused(_corrupt(mutate)) is AdapterErrorCode.MALFORMED_CALL_LIST


@pytest.mark.parametrize(
    "response",
    [
        pytest.param([], id="not-an-object"),
        pytest.param({"choices": []}, id="no-choices"),
        pytest.param({"choices": [{"message": "hi"}]}, id="message-not-object"),
    ],
)
def test_read__malformed_envelope__refused(response: Any) -> None:
    assert _refused(response) is AdapterErrorCode.MALFORMED_ENVELOPE


def test_read__several_choices__refused_rather_than_guessing() -> None:
    response = openai_chat_response([Call("c1", "get_weather", "{}")])
    response["choices"].append(copy.deepcopy(response["choices"][0]) | {"index": 1})
    ChatCompletion.model_validate(response)  # still a valid SDK envelope
    assert _refused(response) is AdapterErrorCode.MULTIPLE_CHOICES


def test_read__duplicate_call_id__refused() -> None:
    response = openai_chat_response(
        [Call("c1", "get_weather", "{}"), Call("c1", "refund", "{}")]
    )
    assert _refused(response) is AdapterErrorCode.DUPLICATE_CALL_ID


@pytest.mark.parametrize("call_id", ["", "   "])
def test_read__empty_call_id__refused(call_id: str) -> None:
    response = openai_chat_response([Call(call_id, "get_weather", "{}")])
    assert _refused(response) is AdapterErrorCode.EMPTY_CALL_ID


def test_read__custom_tool_call__refused_as_unsupported() -> None:
    response = ChatCompletion.model_validate(
        {
            "id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{
                "index": 0, "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "custom", "custom": {"name": "get_weather", "input": "x"}}
                ]},
            }],
        }
    ).to_dict()
    assert _refused(response) is AdapterErrorCode.UNSUPPORTED_CALL_TYPE


def test_read__legacy_function_call__refused_as_unsupported() -> None:
    response = openai_chat_response([], finish_reason="function_call")
    response["choices"][0]["message"]["function_call"] = {"name": "get_weather", "arguments": "{}"}
    ChatCompletion.model_validate(response)
    assert _refused(response) is AdapterErrorCode.UNSUPPORTED_CALL_TYPE


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param('{"city": "Par', id="truncated"),
        pytest.param("{'city': 'Paris'}", id="python-not-json"),
        pytest.param('{"city": "a", "city": "b"}', id="duplicate-key"),
        pytest.param("NaN", id="constant"),
    ],
)
def test_read__invalid_argument_json__one_call_rejected_by_the_gates(arguments: str) -> None:
    registry = make_registry()
    response = openai_chat_response(
        [Call("bad", "get_weather", arguments), Call("good", "get_weather", '{"city": "Oslo"}')]
    )

    proposals = openai_chat.read_proposals(response)

    assert proposals[0].arguments == arguments  # verbatim, for the parse gate
    bad, good = (admit_call(p, registry) for p in proposals)
    assert isinstance(bad, Rejected)
    assert bad.result.error.code is ErrorCode.INVALID_ARGUMENTS_JSON
    assert not isinstance(good, Rejected)


def test_read__unknown_tool__left_to_the_gates() -> None:
    registry = make_registry()
    response = openai_chat_response([Call("c1", "drop_database", "{}")])

    [proposal] = openai_chat.read_proposals(response)

    outcome = admit_call(proposal, registry)
    assert isinstance(outcome, Rejected)
    assert outcome.result.error.code is ErrorCode.UNKNOWN_TOOL


def test_read__encoded_tool_names__decoded_back_to_registry_names() -> None:
    registry = make_registry()
    rule = openai_chat.NAME_RULE
    response = openai_chat_response(
        [
            Call("c1", encode_tool_name("mcp.time/get", rule), '{"timezone": "UTC"}'),
            Call("c2", encode_tool_name(LONG_TOOL_NAME, rule), "{}"),
        ]
    )

    proposals = openai_chat.read_proposals(response, known_names=registry.names())

    assert [p.tool_name for p in proposals] == ["mcp.time/get", LONG_TOOL_NAME]
    assert all(not isinstance(admit_call(p, registry), Rejected) for p in proposals)


def test_read__known_names_as_generator__every_hashed_name_decoded() -> None:
    wire = encode_tool_name(LONG_TOOL_NAME, openai_chat.NAME_RULE)
    response = openai_chat_response([Call("c1", wire, "{}"), Call("c2", wire, "{}")])

    proposals = openai_chat.read_proposals(
        response, known_names=(name for name in make_registry().names())
    )

    assert [p.tool_name for p in proposals] == [LONG_TOOL_NAME, LONG_TOOL_NAME]


# ---------------------------------------------------------------- writing


def test_write__results_in_any_order__one_tool_message_per_call_in_call_order() -> None:
    response = openai_chat_response(
        [Call("c1", "get_weather", "{}"), Call("c2", "refund", "{}"), Call("c3", "get_weather", "{}")]
    )
    calls = openai_chat.read_proposals(response)
    results = [succeeded(calls[2], {"t": 3}), failed(calls[0]), succeeded(calls[1], "ok")]

    messages = openai_chat.write_results(calls, results)

    assert [m["tool_call_id"] for m in messages] == ["c1", "c2", "c3"]
    for message in messages:
        validate_typed(ChatCompletionToolMessageParam, message)
        assert_keys_within(message, ChatCompletionToolMessageParam, {"role", "tool_call_id", "content"})
    assert json_text(messages[0]["content"])["error"]["code"] == "invalid_arguments"
    assert json_text(messages[1]["content"]) == "ok"
    assert json_text(messages[2]["content"]) == {"t": 3}
    # The whole follow-up turn is a valid message list for the SDK.
    assistant = response["choices"][0]["message"]
    validate_typed(list[ChatCompletionMessageParam], [assistant, *messages])


def test_write__untrusted_output__labelled_as_data() -> None:
    [call] = openai_chat.read_proposals(openai_chat_response([Call("c1", "get_weather", "{}")]))

    [message] = openai_chat.write_results([call], [succeeded(call, "<html>…", untrusted=True)])

    assert json_text(message["content"])["untrusted_data"] == "<html>…"


# ---------------------------------------------------------------- export


def test_export__every_tool__valid_sdk_tool_param_with_provider_safe_name() -> None:
    tools = openai_chat.export_tools(make_registry(), SERVER_CONTEXT)

    for tool in tools:
        validate_typed(ChatCompletionFunctionToolParam, tool)
        ChatCompletionFunctionTool.model_validate(tool)
        assert openai_chat.NAME_RULE.accepts(tool["function"]["name"])
    by_name = {tool["function"]["name"]: tool["function"] for tool in tools}
    assert by_name["get_weather"]["strict"] is True
    assert by_name["get_weather"]["parameters"]["required"] == ["city", "unit"]
    # A non-null default cannot be expressed in strict mode: sent non-strict, unchanged.
    assert by_name["refund"]["strict"] is False
    assert by_name["refund"]["parameters"]["required"] == ["order_id", "amount_cents"]
    assert "tf--mcp_2etime_2fget" in by_name


# Run in a fresh interpreter: registers the tools in the order of a set of their
# names (which depends on the hash seed) and prints the export as JSON.
_EXPORT_IN_A_FRESH_PROCESS = """
import json
from adapter_testkit import SERVER_CONTEXT, make_registry
from executor.core.tools import Registry
from executor.providers import openai_chat

tools = {tool.name: tool for tool in make_registry()}
registry = Registry(tools[name] for name in {name for name in tools})
print(json.dumps(openai_chat.export_tools(registry, SERVER_CONTEXT)))
"""


def _export_with_hash_seed(seed: str) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ADAPTER_TESTS), str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    completed = subprocess.run(
        [sys.executable, "-c", _EXPORT_IN_A_FRESH_PROCESS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    exported: list[dict[str, Any]] = json.loads(completed.stdout)
    return exported


def test_export__different_hash_seeds__identical_declarations_sorted_by_tool_name() -> None:
    # Given fresh interpreters with different hash seeds, each registering the tools
    # in its own (set) order
    # When each exports the registry
    exports = {seed: _export_with_hash_seed(seed) for seed in ("0", "1", "12345")}
    # Then every export is the same, byte for byte once serialised
    first = exports["0"]
    for seed, exported in exports.items():
        assert json.dumps(exported) == json.dumps(first), f"PYTHONHASHSEED={seed} changed the export"
    # and in tool-name order, as `declared_tools` promises
    names = sorted(tool.name for tool in make_registry() if exposed_to(tool, SERVER_CONTEXT))
    assert [tool["function"]["name"] for tool in first] == [
        encode_tool_name(name, openai_chat.NAME_RULE) for name in names
    ]
    assert first == openai_chat.export_tools(make_registry(), SERVER_CONTEXT)
