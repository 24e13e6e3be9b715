"""Gemini GenerateContent adapter against `google.genai.types`.

Responses are built with `GenerateContentResponse.model_validate` and dumped by
the SDK both as the REST API spells them (camelCase) and as the SDK's own
`model_dump` does (snake_case). `Content` and `Tool` forbid unknown fields, so
validating the adapter's output with them is a strict check.
"""

from __future__ import annotations

from typing import Any

import pytest
from adapter_testkit import (
    LONG_TOOL_NAME,
    SERVER_CONTEXT,
    Call,
    admit_call,
    failed,
    gemini_response,
    make_registry,
    succeeded,
)
from google.genai import types as genai_types

from executor.core.admission import Rejected
from executor.core.types import ErrorCode
from executor.providers import gemini_generate
from executor.providers.common import AdapterError, AdapterErrorCode, encode_tool_name


def _refused(response: Any) -> AdapterErrorCode:
    with pytest.raises(AdapterError) as excinfo:
        gemini_generate.read_proposals(response)
    assert excinfo.value.surface == "gemini"
    return excinfo.value.code


spellings = pytest.mark.parametrize("spelling", ["camel", "snake"])


# ---------------------------------------------------------------- reading


@spellings
def test_read__function_calls_with_ids__calls_in_part_order(spelling: Any) -> None:
    response = gemini_response(
        [Call("fc-1", "get_weather", {"city": "Oslo"}), Call("fc-2", "refund", {"order_id": "o"})],
        spelling=spelling,
    )

    proposals = gemini_generate.read_proposals(response)

    assert [(p.call_id, p.tool_name, p.arguments) for p in proposals] == [
        ("fc-1", "get_weather", {"city": "Oslo"}),
        ("fc-2", "refund", {"order_id": "o"}),
    ]


@spellings
def test_read__calls_without_ids__deterministic_distinct_synthetic_ids(spelling: Any) -> None:
    calls = [Call(None, "get_weather", {"city": "Oslo"}), Call(None, "get_weather", {"city": "Oslo"})]

    first = gemini_generate.read_proposals(gemini_response(calls, spelling=spelling))
    again = gemini_generate.read_proposals(gemini_response(calls, spelling=spelling))

    assert [p.call_id for p in first] == [p.call_id for p in again]
    assert len({p.call_id for p in first}) == 2
    assert all(gemini_generate.is_synthetic_call_id(p.call_id) for p in first)


def test_read__camel_and_snake_dumps__same_proposals() -> None:
    calls = [Call(None, "get_weather", {"city": "Oslo"}), Call("x", "refund", {})]
    assert gemini_generate.read_proposals(
        gemini_response(calls, spelling="camel")
    ) == gemini_generate.read_proposals(gemini_response(calls, spelling="snake"))


def test_read__call_without_args__empty_object() -> None:
    response = gemini_response([Call("a", "get_weather", None)])
    assert gemini_generate.read_proposals(response)[0].arguments == {}


def test_read__text_answer__no_calls() -> None:
    assert gemini_generate.read_proposals(gemini_response([])) == []


def test_read__blocked_prompt_without_candidates__refused_as_filtered() -> None:
    blocked = genai_types.GenerateContentResponse.model_validate(
        {"promptFeedback": {"blockReason": "SAFETY"}}
    ).model_dump(mode="json", exclude_none=True, by_alias=True)
    with pytest.raises(AdapterError) as excinfo:
        gemini_generate.read_proposals(blocked)
    assert excinfo.value.code is AdapterErrorCode.FILTERED_RESPONSE


def test_read__no_candidates_and_no_block_reason__no_calls() -> None:
    assert gemini_generate.read_proposals({"candidates": []}) == []


@pytest.mark.parametrize("finish", ["MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL"])
def test_read__call_failure_finish_without_calls__refused(finish: str) -> None:
    response = gemini_response([], finish_reason=finish)
    assert _refused(response) is AdapterErrorCode.TOOL_CALLS_WITHOUT_CALLS


def test_read__several_candidates__refused() -> None:
    response = gemini_response([Call("a", "get_weather", {})])
    response["candidates"].append(response["candidates"][0])
    assert _refused(response) is AdapterErrorCode.MULTIPLE_CHOICES


def _corrupt(mutate: Any) -> dict[str, Any]:
    response = gemini_response([Call("a", "get_weather", {"city": "x"})])
    mutate(response["candidates"][0]["content"]["parts"][-1])
    return response


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda p: p.update(functionCall="get_weather"), id="call-not-object"),
        pytest.param(lambda p: p["functionCall"].pop("name"), id="no-name"),
        pytest.param(lambda p: p["functionCall"].update(args="{}"), id="args-text"),
        pytest.param(lambda p: p["functionCall"].update(id=3), id="id-not-text"),
    ],
)
def test_read__malformed_function_call__refused(mutate: Any) -> None:
    assert _refused(_corrupt(mutate)) is AdapterErrorCode.MALFORMED_CALL_LIST


def test_read__both_spellings_in_one_part__refused_as_ambiguous() -> None:
    response = _corrupt(lambda p: p.update(function_call={"name": "refund", "args": {}}))
    assert _refused(response) is AdapterErrorCode.MALFORMED_ENVELOPE


def test_read__duplicate_and_empty_ids__refused() -> None:
    duplicate = gemini_response([Call("a", "get_weather", {}), Call("a", "refund", {})])
    empty = gemini_response([Call("", "get_weather", {})])
    assert _refused(duplicate) is AdapterErrorCode.DUPLICATE_CALL_ID
    assert _refused(empty) is AdapterErrorCode.EMPTY_CALL_ID


def test_read__model_id_with_synthetic_prefix__refused() -> None:
    response = gemini_response([Call(gemini_generate.SYNTHETIC_ID_PREFIX + "0-x", "get_weather", {})])
    assert _refused(response) is AdapterErrorCode.RESERVED_CALL_ID


def test_read__unknown_tool__left_to_the_gates() -> None:
    [proposal] = gemini_generate.read_proposals(gemini_response([Call(None, "nope", {})]))
    outcome = admit_call(proposal, make_registry())
    assert isinstance(outcome, Rejected)
    assert outcome.result.error.code is ErrorCode.UNKNOWN_TOOL


# ---------------------------------------------------------------- writing


def test_write__mixed_ids__responses_carry_model_ids_and_names_in_call_order() -> None:
    registry = make_registry()
    rule = gemini_generate.NAME_RULE
    time_wire = encode_tool_name("mcp.time/get", rule)
    long_wire = encode_tool_name(LONG_TOOL_NAME, rule)
    calls = gemini_generate.read_proposals(
        gemini_response(
            [
                Call(None, "get_weather", {"city": "Oslo"}),
                Call("fc-2", time_wire, {"timezone": "UTC"}),
                Call(None, long_wire, {}),
            ]
        ),
        known_names=registry.names(),
    )
    assert [c.tool_name for c in calls] == ["get_weather", "mcp.time/get", LONG_TOOL_NAME]
    results = [succeeded(calls[2], {"time": "t"}), failed(calls[0]), succeeded(calls[1], "12:00")]

    [content] = gemini_generate.write_results(calls, results)

    validated = genai_types.Content.model_validate(content)
    assert validated.role == "user"
    responses = [part.function_response for part in validated.parts or []]
    assert [(r.id, r.name) for r in responses if r] == [
        (None, "get_weather"),  # the model gave no id: none is invented on the wire
        ("fc-2", time_wire),  # exactly the name the model called
        (None, long_wire),
    ]
    assert [r.response for r in responses if r] == [
        {"error": {"code": "invalid_arguments", "message": "arguments do not match the schema",
                   "details": [{"path": "city", "code": "missing", "expected": "a string"}]}},
        {"output": "12:00"},
        {"output": {"time": "t"}},
    ]


def test_write__untrusted_output__labelled_inside_output() -> None:
    [call] = gemini_generate.read_proposals(gemini_response([Call("a", "get_weather", {})]))

    [content] = gemini_generate.write_results([call], [succeeded(call, "x", untrusted=True)])

    response = content["parts"][0]["functionResponse"]["response"]
    assert response["output"]["untrusted_data"] == "x"


def test_write__no_calls__no_content() -> None:
    assert gemini_generate.write_results([], []) == []


# ---------------------------------------------------------------- export


def test_export__all_tools__one_sdk_tool_with_every_declaration() -> None:
    [tool] = gemini_generate.export_tools(make_registry(), SERVER_CONTEXT)

    validated = genai_types.Tool.model_validate(tool)

    declarations = validated.function_declarations or []
    assert len(declarations) == 5
    for declaration in declarations:
        assert declaration.name and gemini_generate.NAME_RULE.accepts(declaration.name)
        schema = declaration.parameters_json_schema
        assert isinstance(schema, dict) and schema["type"] == "object"


def test_export__empty_registry__no_tool() -> None:
    from executor.core.tools import Registry

    assert gemini_generate.export_tools(Registry(), SERVER_CONTEXT) == []
