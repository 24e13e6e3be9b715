"""Responses adapter against `openai.types.responses` types.

Well-formed responses are built with `Response.model_validate` and serialised
with the SDK's `to_dict()`; malformed ones start from an SDK-built dict with one
field corrupted.
"""

from __future__ import annotations

from typing import Any

import pytest
from adapter_testkit import (
    SERVER_CONTEXT,
    Call,
    admit_call,
    assert_keys_within,
    failed,
    json_text,
    make_registry,
    openai_responses_response,
    succeeded,
    validate_typed,
)
from openai.types.responses import (
    FunctionTool,
    FunctionToolParam,
    ResponseInputItemParam,
    ResponseInputParam,
)
from openai.types.responses.response_input_item_param import FunctionCallOutput

from executor.core.admission import Rejected
from executor.core.types import ErrorCode, ProposedCall
from executor.providers import openai_responses
from executor.providers.common import AdapterError, AdapterErrorCode


def _refused(response: Any) -> AdapterErrorCode:
    with pytest.raises(AdapterError) as excinfo:
        openai_responses.read_proposals(response)
    assert excinfo.value.surface == "openai-responses"
    return excinfo.value.code


# ---------------------------------------------------------------- reading


def test_read__function_calls__correlated_by_call_id_not_item_id() -> None:
    response = openai_responses_response(
        [Call("call_1", "get_weather", '{"city":"Oslo"}'), Call("call_2", "refund", "{")]
    )
    assert [item.get("id") for item in response["output"][1:]] == ["fc_0", "fc_1"]

    proposals = openai_responses.read_proposals(response)

    assert proposals == [
        ProposedCall(call_id="call_1", tool_name="get_weather", arguments='{"city":"Oslo"}'),
        ProposedCall(call_id="call_2", tool_name="refund", arguments="{"),
    ]


def test_read__message_only__no_calls() -> None:
    assert openai_responses.read_proposals(openai_responses_response([])) == []


def test_read__server_side_items__skipped() -> None:
    web_search = {
        "type": "web_search_call", "id": "ws_1", "status": "completed",
        "action": {"type": "search", "query": "weather"},
    }
    response = openai_responses_response(
        [Call("call_1", "get_weather", "{}")], extra_items=[web_search]
    )
    assert [p.call_id for p in openai_responses.read_proposals(response)] == ["call_1"]


@pytest.mark.parametrize(
    "item",
    [
        pytest.param(
            {"type": "custom_tool_call", "call_id": "c9", "name": "x", "input": "hi", "id": "ctc"},
            id="custom-tool",
        ),
    ],
)
def test_read__client_answered_item_toolfence_never_declared__refused(item: dict[str, Any]) -> None:
    response = openai_responses_response([Call("call_1", "get_weather", "{}")], extra_items=[item])
    assert _refused(response) is AdapterErrorCode.UNSUPPORTED_CALL_TYPE


def test_read__namespaced_function__refused_rather_than_aliased() -> None:
    response = openai_responses_response([Call("call_1", "get_weather", "{}")])
    response["output"][-1]["namespace"] = "crm"
    assert _refused(response) is AdapterErrorCode.UNSUPPORTED_CALL_TYPE


def _corrupt(mutate: Any) -> dict[str, Any]:
    response = openai_responses_response([Call("call_1", "get_weather", "{}")])
    mutate(response["output"][-1])
    return response


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda i: i.pop("call_id"), id="no-call-id"),
        pytest.param(lambda i: i.update(call_id=7), id="call-id-not-text"),
        pytest.param(lambda i: i.pop("name"), id="no-name"),
        pytest.param(lambda i: i.update(arguments={"city": "x"}), id="arguments-object-not-text"),
    ],
)
def test_read__malformed_function_call__refused(mutate: Any) -> None:
    assert _refused(_corrupt(mutate)) is AdapterErrorCode.MALFORMED_CALL_LIST


@pytest.mark.parametrize(
    "response",
    [[], {"output": None}, {"output": ["not an item"]}],
    ids=["not-an-object", "no-output", "item-not-object"],
)
def test_read__malformed_envelope__refused(response: Any) -> None:
    assert _refused(response) is AdapterErrorCode.MALFORMED_ENVELOPE


def test_read__duplicate_call_id__refused() -> None:
    response = openai_responses_response(
        [Call("call_1", "get_weather", "{}"), Call("call_1", "get_weather", "{}")]
    )
    assert _refused(response) is AdapterErrorCode.DUPLICATE_CALL_ID


def test_read__empty_call_id__refused() -> None:
    response = openai_responses_response([Call("", "get_weather", "{}")])
    assert _refused(response) is AdapterErrorCode.EMPTY_CALL_ID


def test_read__truncated_arguments_and_unknown_tool__each_rejected_by_the_gates() -> None:
    registry = make_registry()
    response = openai_responses_response(
        [Call("call_1", "get_weather", '{"city": "Os'), Call("call_2", "rm_rf", "{}")]
    )

    truncated, unknown = (admit_call(p, registry) for p in openai_responses.read_proposals(response))

    assert isinstance(truncated, Rejected) and isinstance(unknown, Rejected)
    assert truncated.result.error.code is ErrorCode.INVALID_ARGUMENTS_JSON
    assert unknown.result.error.code is ErrorCode.UNKNOWN_TOOL


# ---------------------------------------------------------------- writing


def test_write__results_in_any_order__function_call_outputs_in_call_order() -> None:
    calls = openai_responses.read_proposals(
        openai_responses_response(
            [Call("call_1", "get_weather", "{}"), Call("call_2", "refund", "{}")]
        )
    )

    items = openai_responses.write_results(
        calls, [failed(calls[1], retryable=True), succeeded(calls[0], {"temperature": 4.5})]
    )

    assert [item["call_id"] for item in items] == ["call_1", "call_2"]
    for item in items:
        validate_typed(ResponseInputItemParam, item)
        assert_keys_within(item, FunctionCallOutput, {"type", "call_id", "output"})
        assert item["type"] == "function_call_output"
    validate_typed(ResponseInputParam, items)
    assert json_text(items[0]["output"]) == {"temperature": 4.5}
    assert json_text(items[1]["output"])["error"]["code"] == "upstream_unavailable"


# ---------------------------------------------------------------- export


def test_export__every_tool__valid_function_tool_with_strict_where_faithful() -> None:
    tools = openai_responses.export_tools(make_registry(), SERVER_CONTEXT)

    for tool in tools:
        validate_typed(FunctionToolParam, tool)
        FunctionTool.model_validate(tool)
        assert openai_responses.NAME_RULE.accepts(tool["name"])
    strict = {tool["name"]: tool["strict"] for tool in tools}
    assert strict["get_weather"] is True and strict["refund"] is False
