"""Gemini Interactions adapter against `google.genai.interactions` types.

Interactions are built with `Interaction.model_validate` and dumped by the SDK;
written steps are validated as `FunctionResultStep` (and must not come back as
the SDK's catch-all `UnknownStep`) and as the `input` parameter type.
"""

from __future__ import annotations

from typing import Any

import pytest
from adapter_testkit import (
    SERVER_CONTEXT,
    Call,
    admit_call,
    failed,
    interaction_response,
    json_text,
    make_registry,
    succeeded,
    validate_typed,
)
from google.genai import interactions as genai_interactions
from pydantic import TypeAdapter

from executor.core.admission import Rejected
from executor.core.types import ErrorCode, ProposedCall
from executor.providers import gemini_interactions
from executor.providers.common import AdapterError, AdapterErrorCode, encode_tool_name


def _refused(response: Any) -> AdapterErrorCode:
    with pytest.raises(AdapterError) as excinfo:
        gemini_interactions.read_proposals(response)
    assert excinfo.value.surface == "gemini-interactions"
    return excinfo.value.code


# ---------------------------------------------------------------- reading


def test_read__function_call_steps__calls_in_step_order() -> None:
    response = interaction_response(
        [Call("c1", "get_weather", {"city": "Oslo"}), Call("c2", "refund", {})]
    )

    assert gemini_interactions.read_proposals(response) == [
        ProposedCall(call_id="c1", tool_name="get_weather", arguments={"city": "Oslo"}),
        ProposedCall(call_id="c2", tool_name="refund", arguments={}),
    ]


def test_read__calls_already_answered_in_the_interaction__not_proposed_again() -> None:
    earlier: list[dict[str, Any]] = [
        {"type": "function_call", "id": "c0", "name": "get_weather", "arguments": {}},
        {"type": "function_result", "call_id": "c0", "name": "get_weather", "result": "{}"},
    ]
    response = interaction_response([Call("c1", "refund", {})], earlier_steps=earlier)

    assert [p.call_id for p in gemini_interactions.read_proposals(response)] == ["c1"]


def test_read__completed_text_answer__no_calls() -> None:
    response = interaction_response([], status="completed")
    assert gemini_interactions.read_proposals(response) == []


def test_read__requires_action_without_pending_call__refused() -> None:
    assert _refused(interaction_response([])) is AdapterErrorCode.TOOL_CALLS_WITHOUT_CALLS


def _corrupt(mutate: Any) -> dict[str, Any]:
    response = interaction_response([Call("c1", "get_weather", {"city": "x"})])
    mutate(response["steps"][-1])
    return response


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda s: s.pop("id"), id="no-id"),
        pytest.param(lambda s: s.pop("name"), id="no-name"),
        pytest.param(lambda s: s.update(arguments='{"city":"x"}'), id="arguments-text"),
        pytest.param(lambda s: s.pop("arguments"), id="no-arguments"),
    ],
)
def test_read__malformed_call_step__refused(mutate: Any) -> None:
    assert _refused(_corrupt(mutate)) is AdapterErrorCode.MALFORMED_CALL_LIST


@pytest.mark.parametrize(
    "response", [[], {"status": "completed", "steps": {}}, {"steps": ["x"]}],
    ids=["not-an-object", "steps-not-list", "step-not-object"],
)
def test_read__malformed_envelope__refused(response: Any) -> None:
    assert _refused(response) is AdapterErrorCode.MALFORMED_ENVELOPE


def test_read__duplicate_and_empty_ids__refused() -> None:
    duplicate = interaction_response([Call("c1", "get_weather", {}), Call("c1", "refund", {})])
    empty = interaction_response([Call("", "get_weather", {})])
    assert _refused(duplicate) is AdapterErrorCode.DUPLICATE_CALL_ID
    assert _refused(empty) is AdapterErrorCode.EMPTY_CALL_ID


def test_read__unknown_tool__left_to_the_gates() -> None:
    [proposal] = gemini_interactions.read_proposals(interaction_response([Call("c", "x", {})]))
    outcome = admit_call(proposal, make_registry())
    assert isinstance(outcome, Rejected)
    assert outcome.result.error.code is ErrorCode.UNKNOWN_TOOL


# ---------------------------------------------------------------- writing


def test_write__results_in_any_order__function_result_steps_in_call_order() -> None:
    time_wire = encode_tool_name("mcp.time/get", gemini_interactions.NAME_RULE)
    calls = gemini_interactions.read_proposals(
        interaction_response(
            [Call("c1", "get_weather", {}), Call("c2", time_wire, {"timezone": "UTC"})]
        )
    )
    assert calls[1].tool_name == "mcp.time/get"

    steps = gemini_interactions.write_results(calls, [succeeded(calls[1], "12:00"), failed(calls[0])])

    # As the `input` of the next create call. (The *Param TypedDicts reference
    # IO[bytes] for media, which pydantic cannot build a validator for, so the
    # SDK's model-side union is used.)
    parsed = TypeAdapter(genai_interactions.InteractionsInput).validate_python(steps)
    assert isinstance(parsed, list)
    assert all(isinstance(step, genai_interactions.FunctionResultStep) for step in parsed)
    assert [
        step.model_dump(mode="json", exclude_none=True)
        for step in parsed
        if isinstance(step, genai_interactions.FunctionResultStep)
    ] == steps
    assert [(s["call_id"], s["name"], s["is_error"]) for s in steps] == [
        ("c1", "get_weather", True),
        ("c2", time_wire, False),
    ]
    assert json_text(steps[0]["result"])["error"]["code"] == "invalid_arguments"
    assert json_text(steps[1]["result"]) == "12:00"


# ---------------------------------------------------------------- export


def test_export__every_tool__valid_function_tool() -> None:
    tools = gemini_interactions.export_tools(make_registry(), SERVER_CONTEXT)

    for tool in tools:
        parsed = TypeAdapter(genai_interactions.Tool).validate_python(tool)
        assert isinstance(parsed, genai_interactions.Function)
        validate_typed(genai_interactions.ToolParam, tool)
        assert gemini_interactions.NAME_RULE.accepts(tool["name"])
    assert len(tools) == 5
