"""Deny by default: every item, block, part and step type is read, reported or refused
(decision 0195).

The types come from the installed SDKs' pydantic models (the `type` Literal of
each member of an output union, the fields of Gemini's `Part`), not from a hand
list, so a type a new SDK adds fails here until its adapter handles it. A
type that calls nothing (text, reasoning, an echoed result) passes only when
the adapter names it as such; any other type the adapter meets at run time is
reported by `read_hosted_calls` as an unknown item, which no policy allows.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Any

import anthropic.types as anthropic_types
import anthropic.types.beta as anthropic_beta
import openai.types.responses as responses_types
import pytest
from adapter_testkit import anthropic_response, openai_chat_response, sdk_literals
from google.genai import interactions as genai_interactions
from google.genai import types as genai_types
from openai.types.chat import ChatCompletionMessageToolCallUnion

from executor.providers import (
    SURFACES,
    anthropic_messages,
    gemini_generate,
    gemini_interactions,
    openai_responses,
)
from executor.providers.common import AdapterError
from executor.providers.hosted import (
    NO_HOSTED_TOOLS,
    HostedCall,
    HostedPolicy,
    hosted_violations,
)


def _members(union: Any) -> list[Any]:
    """The model classes of a (possibly Annotated) union."""
    if typing.get_origin(union) is typing.Annotated:
        union = typing.get_args(union)[0]
    # `Unknown*` is an SDK's catch-all for types it does not know: no type of its own.
    return [
        member for member in typing.get_args(union)
        if hasattr(member, "model_fields") and not member.__name__.startswith("Unknown")
    ]



def _type_values(*unions: Any) -> list[str]:
    values: set[str] = set()
    for union in unions:
        for member in _members(union):
            field = member.model_fields.get("type")
            if field is not None:
                values |= sdk_literals(field.annotation)
    assert len(values) >= 5, "the SDK's types were not found"
    return sorted(values)


def _outcome(surface_name: str, response: Mapping[str, Any]) -> tuple[str, list[HostedCall]]:
    """read (a proposal), refused (the envelope), reported (a hosted call) or inert."""
    surface = SURFACES[surface_name]
    try:
        proposals = surface.read_proposals(response)
    except AdapterError:
        return "refused", []
    hosted = surface.read_hosted_calls(response)
    if proposals:
        return "read", hosted
    return ("reported" if hosted else "inert"), hosted


# Every field a test item carries, so each type finds the fields its reader wants.
_ITEM_FIELDS: dict[str, Any] = {
    "id": "item_1", "call_id": "call_1", "name": "get_weather", "arguments": "{}",
    "status": "completed", "server_label": "docs", "execution": "server", "content": [],
}


def _responses_with(kind: str) -> dict[str, Any]:
    return {"status": "completed", "output": [{**_ITEM_FIELDS, "type": kind}]}


RESPONSES_TYPES = _type_values(responses_types.ResponseOutputItem)


@pytest.mark.parametrize("kind", RESPONSES_TYPES)
def test_responses__every_sdk_output_item__read_reported_or_refused(kind: str) -> None:
    outcome, hosted = _outcome("openai-responses", _responses_with(kind))
    assert kind in openai_responses.KNOWN_ITEMS
    assert not any(call.unknown for call in hosted)
    if outcome == "inert":
        assert kind in openai_responses._INERT_ITEMS, f"{kind} is skipped without being named inert"


def test_responses__image_generation_and_server_tool_search__reported() -> None:
    # Given the provider-run items that were read by neither reader before
    for kind, tool in (("image_generation_call", "image_generation"), ("tool_search_call", "tool_search")):
        outcome, hosted = _outcome("openai-responses", _responses_with(kind))
        # Then each is a hosted call of its built-in tool, outside a policy that names none
        assert outcome == "reported" and [c.tool_name for c in hosted] == [tool]
        assert len(hosted_violations(hosted, NO_HOSTED_TOOLS)) == 1
        allowed = HostedPolicy(servers=(), builtin_tools=frozenset({tool}))
        assert hosted_violations(hosted, allowed) == []


def test_responses__client_tool_search__refused_not_reported() -> None:
    response = _responses_with("tool_search_call")
    response["output"][0]["execution"] = "client"
    assert _outcome("openai-responses", response)[0] == "refused"


CHAT_CALL_TYPES = sorted(
    set().union(
        *(
            sdk_literals(m.model_fields["type"].annotation)
            for m in _members(ChatCompletionMessageToolCallUnion)
        )
    )
)


@pytest.mark.parametrize("kind", CHAT_CALL_TYPES)
def test_chat__every_sdk_tool_call_type__read_or_refused(kind: str) -> None:
    response = openai_chat_response([])
    response["choices"][0]["finish_reason"] = "tool_calls"
    response["choices"][0]["message"]["tool_calls"] = [
        {"id": "call_1", "type": kind, "function": {"name": "get_weather", "arguments": "{}"},
         "custom": {"name": "grammar", "input": "x"}}
    ]
    outcome, _ = _outcome("openai-chat", response)
    assert outcome in ("read", "refused")


ANTHROPIC_TYPES = _type_values(anthropic_types.ContentBlock, anthropic_beta.BetaContentBlock)


def _anthropic_with(kind: str) -> dict[str, Any]:
    block = {
        "type": kind, "id": "toolu_1", "tool_use_id": "toolu_1", "name": "get_weather", "input": {},
        "text": "", "content": [], "server_name": "docs", "mcp_server_name": "docs", "tools": [],
    }
    return {**anthropic_response([], stop_reason="end_turn"), "content": [block]}


@pytest.mark.parametrize("kind", ANTHROPIC_TYPES)
def test_anthropic__every_sdk_content_block__read_reported_or_refused(kind: str) -> None:
    outcome, hosted = _outcome("anthropic", _anthropic_with(kind))
    assert anthropic_messages.is_known_block(kind)
    assert not any(call.unknown for call in hosted)
    if outcome == "inert":
        assert kind in anthropic_messages._INERT_BLOCKS, f"{kind} is skipped without being named inert"


# A value for each Part field; only the reader of the field looks inside it.
_PART_VALUES: dict[str, Any] = {
    "function_call": {"name": "get_weather", "args": {}, "id": "c1"},
    "tool_call": {"toolType": "GOOGLE_SEARCH_WEB", "args": {"queries": ["x"]}, "id": "t1"},
    "tool_response": {"toolType": "GOOGLE_SEARCH_WEB", "response": {"ok": True}, "id": "t1"},
    "executable_code": {"language": "PYTHON", "code": "print(1)"},
    "code_execution_result": {"outcome": "OUTCOME_OK", "output": "1"},
}
GEMINI_PART_FIELDS = sorted(genai_types.Part.model_fields)


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(word.title() for word in rest)


def _gemini_with(part: dict[str, Any]) -> dict[str, Any]:
    return {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP"}]}


@pytest.mark.parametrize("field", GEMINI_PART_FIELDS)
@pytest.mark.parametrize("spelling", ["camel", "snake"])
def test_gemini__every_sdk_part_field__read_reported_or_refused(field: str, spelling: str) -> None:
    key = _camel(field) if spelling == "camel" else field
    outcome, hosted = _outcome("gemini", _gemini_with({key: _PART_VALUES.get(field, "x")}))
    assert field in gemini_generate.KNOWN_PART_FIELDS
    assert not any(call.unknown for call in hosted)
    if field in _PART_VALUES:
        assert outcome in ("read", "reported", "refused"), field


def test_gemini__google_search_tool_call_part__reported_as_google_search() -> None:
    part = {"toolCall": _PART_VALUES["tool_call"]}
    outcome, hosted = _outcome("gemini", _gemini_with(part))
    assert outcome == "reported"
    assert [(c.kind, c.tool_name, c.unknown) for c in hosted] == [("tool_call", "google_search", False)]
    assert len(hosted_violations(hosted, NO_HOSTED_TOOLS)) == 1


def test_gemini__every_sdk_server_tool_type__named() -> None:
    for tool_type in genai_types.ToolType:
        if tool_type.value == "TOOL_TYPE_UNSPECIFIED":
            continue
        part: dict[str, Any] = {"toolCall": {"toolType": tool_type.value, "args": {}}}
        _, hosted = _outcome("gemini", _gemini_with(part))
        assert [c.unknown for c in hosted] == [False], tool_type


INTERACTION_TYPES = _type_values(genai_interactions.Step)


@pytest.mark.parametrize("kind", INTERACTION_TYPES)
def test_interactions__every_sdk_step__read_reported_or_refused(kind: str) -> None:
    step = {"type": kind, "id": "s1", "call_id": "s0", "name": "get_weather", "arguments": {},
            "server_name": "docs", "content": []}
    outcome, hosted = _outcome("gemini-interactions", {"status": "completed", "steps": [step]})
    assert gemini_interactions.is_known_step(kind)
    assert not any(call.unknown for call in hosted)
    if outcome == "inert":
        assert kind in gemini_interactions._INERT_STEPS or kind == "function_result", kind


# ---------------------------------------------------------------- a type no SDK has yet

UNKNOWN: dict[str, Callable[[], dict[str, Any]]] = {
    "openai-responses": lambda: _responses_with("brand_new_thing"),
    "anthropic": lambda: _anthropic_with("brand_new_block"),
    "gemini": lambda: _gemini_with({"brandNewPart": {"query": "x"}}),
    "gemini-interactions": lambda: {"status": "completed", "steps": [{"type": "brand_new_step", "id": "s1"}]},
}


@pytest.mark.parametrize("surface_name", sorted(UNKNOWN))
def test_unknown_item_type__reported_never_skipped(surface_name: str) -> None:
    # Given an item of a type the adapter does not know
    outcome, hosted = _outcome(surface_name, UNKNOWN[surface_name]())
    # Then it is reported as an unknown hosted call that no policy allows
    assert outcome == "reported" and [c.unknown for c in hosted] == [True]
    everything = HostedPolicy(
        servers=(), builtin_tools=frozenset({"web_search", "google_search", "code_execution"})
    )
    (violation,) = hosted_violations(hosted, everything)
    assert violation.error.details[0].code == "unknown_item"


def test_unknown_item__kind_bounded() -> None:
    response = _responses_with("x_call" * 10_000)
    _, hosted = _outcome("openai-responses", response)
    assert len(hosted[0].kind) <= 80


def test_chat__runs_nothing_itself() -> None:
    # Chat Completions has no provider-run items; its call types are walked above.
    assert SURFACES["openai-chat"].read_hosted_calls(openai_chat_response([])) == []


# ---------------------------------------------------------------- metric labels


def test_hosted_kinds__every_kind_read_from_sdk_types__a_metric_label_value() -> None:
    # toolfence_hosted_calls_total{kind} counts these by name; any other kind is `other`.
    from executor.telemetry.metrics import HOSTED_KIND

    kinds: set[str] = set()
    responses: list[tuple[str, dict[str, Any]]] = [
        *(("openai-responses", _responses_with(kind)) for kind in RESPONSES_TYPES),
        *(("anthropic", _anthropic_with(kind)) for kind in ANTHROPIC_TYPES),
        *(("gemini", _gemini_with({field: _PART_VALUES.get(field, "x")})) for field in GEMINI_PART_FIELDS),
        *(("gemini", _gemini_with({"toolCall": {"toolType": t.value}})) for t in genai_types.ToolType),
        *(
            ("gemini-interactions", {"status": "completed", "steps": [
                {"type": kind, "id": "s1", "call_id": "s0", "name": "n", "arguments": {}}
            ]})
            for kind in INTERACTION_TYPES
        ),
    ]
    for surface_name, response in responses:
        _, hosted = _outcome(surface_name, response)
        kinds |= {call.kind for call in hosted if not call.is_result and not call.unknown}
    assert len(kinds) >= 15
    assert kinds <= HOSTED_KIND.values


@pytest.mark.parametrize("kind", ["nul\u0000_call", "\ud800_call", "line\nbreak_call"])
def test_unknown_item__unprintable_type__recorded_by_digest(kind: str) -> None:
    _, hosted = _outcome("openai-responses", _responses_with(kind))
    (call,) = hosted
    assert call.unknown and call.kind.startswith("<unprintable ") and call.kind.isprintable()
