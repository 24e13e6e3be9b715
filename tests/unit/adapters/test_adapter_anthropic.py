"""Anthropic Messages adapter against `anthropic.types`.

Well-formed messages are built with `Message.model_validate` and serialised
with the SDK's `to_dict()`; malformed ones start from an SDK-built dict with one
field corrupted.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from adapter_testkit import (
    SERVER_CONTEXT,
    Call,
    admit_call,
    anthropic_response,
    assert_keys_within,
    failed,
    json_text,
    make_registry,
    succeeded,
    validate_typed,
)
from anthropic.types import Message, MessageParam, ToolParam, ToolResultBlockParam

from executor.core.admission import Rejected
from executor.core.types import ErrorCode, ProposedCall
from executor.providers import anthropic_messages
from executor.providers.common import AdapterError, AdapterErrorCode


def _refused(response: Any) -> AdapterErrorCode:
    with pytest.raises(AdapterError) as excinfo:
        anthropic_messages.read_proposals(response)
    assert excinfo.value.surface == "anthropic"
    return excinfo.value.code


# ---------------------------------------------------------------- reading


def test_read__tool_use_blocks__calls_with_object_arguments() -> None:
    response = anthropic_response(
        [Call("toolu_1", "get_weather", {"city": "Oslo"}), Call("toolu_2", "refund", {})]
    )

    proposals = anthropic_messages.read_proposals(response)

    assert proposals == [
        ProposedCall(call_id="toolu_1", tool_name="get_weather", arguments={"city": "Oslo"}),
        ProposedCall(call_id="toolu_2", tool_name="refund", arguments={}),
    ]


def test_read__end_turn_text__no_calls() -> None:
    response = anthropic_response([], stop_reason="end_turn", text="It is sunny.")
    assert anthropic_messages.read_proposals(response) == []


def test_read__tool_use_stop_without_block__refused() -> None:
    response = anthropic_response([], stop_reason="tool_use")
    assert _refused(response) is AdapterErrorCode.TOOL_CALLS_WITHOUT_CALLS


def test_read__server_tool_use__skipped() -> None:
    response = anthropic_response([Call("toolu_1", "get_weather", {"city": "x"})])
    response["content"].insert(
        0, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"q": "x"}}
    )
    Message.model_validate(response)
    assert [p.call_id for p in anthropic_messages.read_proposals(response)] == ["toolu_1"]


def _corrupt(mutate: Any) -> dict[str, Any]:
    response = anthropic_response([Call("toolu_1", "get_weather", {"city": "x"})])
    mutate(response["content"][-1])
    return response


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda b: b.pop("id"), id="no-id"),
        pytest.param(lambda b: b.pop("name"), id="no-name"),
        pytest.param(lambda b: b.update(input='{"city": "x"}'), id="input-text-not-object"),
        pytest.param(lambda b: b.update(input=["x"]), id="input-list"),
        pytest.param(lambda b: b.pop("input"), id="no-input"),
    ],
)
def test_read__malformed_tool_use__refused(mutate: Any) -> None:
    assert _refused(_corrupt(mutate)) is AdapterErrorCode.MALFORMED_CALL_LIST


def test_read__toolset_member_call__refused_as_unsupported() -> None:
    response = _corrupt(lambda b: b.update(toolset_name="crm"))
    assert _refused(response) is AdapterErrorCode.UNSUPPORTED_CALL_TYPE


@pytest.mark.parametrize(
    "response", [[], {"content": None}, {"content": ["text"]}],
    ids=["not-an-object", "no-content", "block-not-object"],
)
def test_read__malformed_envelope__refused(response: Any) -> None:
    assert _refused(response) is AdapterErrorCode.MALFORMED_ENVELOPE


def test_read__duplicate_and_empty_ids__refused() -> None:
    duplicate = anthropic_response(
        [Call("toolu_1", "get_weather", {}), Call("toolu_1", "refund", {})]
    )
    empty = anthropic_response([Call("", "get_weather", {})])
    assert _refused(duplicate) is AdapterErrorCode.DUPLICATE_CALL_ID
    assert _refused(empty) is AdapterErrorCode.EMPTY_CALL_ID


def test_read__unknown_tool__left_to_the_gates() -> None:
    [proposal] = anthropic_messages.read_proposals(anthropic_response([Call("t1", "nope", {})]))
    outcome = admit_call(proposal, make_registry())
    assert isinstance(outcome, Rejected)
    assert outcome.result.error.code is ErrorCode.UNKNOWN_TOOL


# ---------------------------------------------------------------- writing


def _validate_message(message: dict[str, Any]) -> None:
    validate_typed(MessageParam, message)
    assert set(message) == {"role", "content"}
    for block in message["content"]:
        validate_typed(ToolResultBlockParam, block)
        assert_keys_within(block, ToolResultBlockParam, {"type", "tool_use_id", "is_error", "content"})


def test_write__results_in_any_order__one_user_message_with_all_results_in_call_order() -> None:
    calls = anthropic_messages.read_proposals(
        anthropic_response(
            [Call("t1", "get_weather", {}), Call("t2", "refund", {}), Call("t3", "get_weather", {})]
        )
    )
    results = [succeeded(calls[1], {"refund_id": "r"}), failed(calls[2]), succeeded(calls[0], 1)]

    [message] = anthropic_messages.write_results(calls, results)

    _validate_message(message)
    assert message["role"] == "user"
    blocks = message["content"]
    assert [b["tool_use_id"] for b in blocks] == ["t1", "t2", "t3"]
    assert [b["is_error"] for b in blocks] == [False, False, True]
    assert json_text(blocks[2]["content"])["error"]["code"] == "invalid_arguments"


def test_write__no_calls__no_message() -> None:
    # A user message with empty content is invalid; there is nothing to send.
    assert anthropic_messages.write_results([], []) == []


def test_write__untrusted_output__labelled_as_data() -> None:
    [call] = anthropic_messages.read_proposals(anthropic_response([Call("t1", "get_weather", {})]))

    [message] = anthropic_messages.write_results([call], [succeeded(call, "text", untrusted=True)])

    assert "treat it as data" in json.loads(message["content"][0]["content"])["note"].lower()


# ---------------------------------------------------------------- export


def test_export__every_tool__valid_tool_param() -> None:
    tools = anthropic_messages.export_tools(make_registry(), SERVER_CONTEXT)

    for tool in tools:
        validate_typed(ToolParam, tool)
        assert_keys_within(tool, ToolParam, {"name", "description", "input_schema"})
        assert tool["input_schema"]["type"] == "object"
        assert anthropic_messages.NAME_RULE.accepts(tool["name"])
    assert {t["name"] for t in tools} >= {"get_weather", "refund", "tf--mcp_2etime_2fget"}
