"""Shared pieces for the adapter tests: a small registry, results, and provider
responses built with each official SDK's own response types.

Every response the tests read is first validated by the SDK's model and then
serialised by the SDK, so the adapters are tested against what the SDKs really
produce, not against hand-written dicts that merely look right.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anthropic.types as anthropic_types
import openai.types.chat as openai_chat_types
import openai.types.responses as openai_responses_types
from google.genai import interactions as genai_interactions
from google.genai import types as genai_types
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from executor.core.admission import Admitted, Rejected, admit
from executor.core.tools import Access, Approval, Effect, Mode, Registry, Tool
from executor.core.types import (
    ErrorCode,
    ErrorDetail,
    FailedRetryable,
    FailedTerminal,
    ProposedCall,
    ServerContext,
    Succeeded,
    ToolError,
)
from executor.sandbox import run_python_tool

# ---------------------------------------------------------------- tools

LONG_TOOL_NAME = "mcp.analytics-warehouse/" + "quarterly_revenue_breakdown_by_region_" * 2


class WeatherArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    city: str = Field(description="City name")
    unit: Literal["c", "f"] | None = None


class WeatherOut(BaseModel):
    temperature: float


class TimeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timezone: str


class TimeOut(BaseModel):
    time: str


# Not strict-able: `reason` is optional with a non-null default.
class RefundArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_id: str
    amount_cents: int = Field(gt=0)
    reason: str = "customer_request"


class RefundOut(BaseModel):
    refund_id: str


class EmptyArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _unused(args: Any, ctx: Any) -> Any:
    raise AssertionError("adapter tests never run a tool")


def make_registry() -> Registry:
    public = Access.public_tool()
    never = Approval.never()
    return Registry(
        [
            Tool(
                name="get_weather", description="Current weather for a city.", mode=Mode.READ,
                untrusted_output=False,
                input_model=WeatherArgs, output_model=WeatherOut, run=_unused,
                access=public, approval=never,
            ),
            Tool(
                name="mcp.time/get", description="Current time in a timezone (MCP).",
                mode=Mode.READ, input_model=TimeArgs, output_model=TimeOut, run=_unused,
                untrusted_output=False,
                access=public, approval=never,
            ),
            Tool(
                name="refund", description="Refund part of an order.", mode=Mode.WRITE,
                untrusted_output=False,
                input_model=RefundArgs, output_model=RefundOut, run=_unused,
                access=public, approval=never, effect=[Effect.IDEMPOTENT],
            ),
            # The built-in sandboxed code tool (executor/sandbox): its declaration
            # exports to every surface like any other tool's.
            run_python_tool(access=public),
            Tool(
                name=LONG_TOOL_NAME, description="A tool whose name no provider accepts as is.",
                mode=Mode.READ, input_model=EmptyArgs, output_model=TimeOut, run=_unused,
                untrusted_output=False,
                access=public, approval=never,
            ),
        ]
    )


SERVER_CONTEXT = ServerContext(principal="alice", tenant="acme", request_id="req-1")


def admit_call(call: ProposedCall, registry: Registry) -> Admitted | Rejected:
    return admit(call, registry, SERVER_CONTEXT)


# ---------------------------------------------------------------- results


def succeeded(call: ProposedCall, output: Any = None, *, untrusted: bool = False) -> Succeeded:
    return Succeeded(
        call_id=call.call_id, tool_name=call.tool_name, output=output, untrusted=untrusted
    )


def failed(call: ProposedCall, *, retryable: bool = False) -> FailedTerminal | FailedRetryable:
    error = ToolError(
        code=ErrorCode.UPSTREAM_UNAVAILABLE if retryable else ErrorCode.INVALID_ARGUMENTS,
        message="arguments do not match the schema",
        details=(ErrorDetail(path="city", code="missing", expected="a string"),),
    )
    if retryable:
        return FailedRetryable(call_id=call.call_id, tool_name=call.tool_name, error=error)
    return FailedTerminal(call_id=call.call_id, tool_name=call.tool_name, error=error)


# ---------------------------------------------------------------- SDK-built responses


@dataclass(frozen=True)
class Call:
    """A call as a provider would emit it: `arguments` is text for OpenAI surfaces,
    an object for the others; `call_id` None means "the model gave no id" (Gemini)."""

    call_id: str | None
    name: str
    arguments: Any


def openai_chat_response(
    calls: Sequence[Call], *, finish_reason: str = "tool_calls", content: str | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in calls
        ]
    completion = openai_chat_types.ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "gpt-test",
            "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}],
        }
    )
    return completion.to_dict()


def openai_responses_response(
    calls: Sequence[Call], *, extra_items: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    output: list[Any] = [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}],
        },
        *extra_items,
    ]
    output += [
        {
            "type": "function_call",
            "id": f"fc_{index}",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        }
        for index, call in enumerate(calls)
    ]
    response = openai_responses_types.Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 1_700_000_000,
            "model": "gpt-test",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "status": "completed",
        }
    )
    return response.to_dict()


def anthropic_response(
    calls: Sequence[Call], *, stop_reason: str = "tool_use", text: str | None = "Checking."
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [
        {"type": "tool_use", "id": call.call_id, "name": call.name, "input": call.arguments}
        for call in calls
    ]
    message = anthropic_types.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }
    )
    return message.to_dict()


def gemini_response(
    calls: Sequence[Call],
    *,
    finish_reason: str = "STOP",
    spelling: Literal["camel", "snake"] = "camel",
) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": "Checking."}]
    for call in calls:
        function_call: dict[str, Any] = {"name": call.name, "args": call.arguments}
        if call.call_id is not None:
            function_call["id"] = call.call_id
        parts.append({"functionCall": function_call})
    response = genai_types.GenerateContentResponse.model_validate(
        {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "finishReason": finish_reason}
            ]
        }
    )
    # camelCase is what the REST API sends; snake_case is what the SDK dumps.
    return response.model_dump(mode="json", exclude_none=True, by_alias=spelling == "camel")


def interaction_response(
    calls: Sequence[Call],
    *,
    status: str = "requires_action",
    earlier_steps: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    steps: list[Any] = [
        {"type": "user_input", "content": [{"type": "text", "text": "What's the weather?"}]},
        *earlier_steps,
        {"type": "thought", "signature": "c2ln"},
    ]
    steps += [
        {"type": "function_call", "id": call.call_id, "name": call.name, "arguments": call.arguments}
        for call in calls
    ]
    interaction = genai_interactions.Interaction.model_validate(
        {"id": "int_1", "status": status, "steps": steps}
    )
    return interaction.model_dump(mode="json", exclude_none=True)


# ---------------------------------------------------------------- validating what adapters write


def assert_keys_within(value: Mapping[str, Any], typed_dict: Any, required: set[str]) -> None:
    """TypedDict validation ignores unknown keys, so check them: every key must be
    one the SDK declares, and the ones the API requires must be there."""
    declared = set(typed_dict.__required_keys__) | set(typed_dict.__optional_keys__)
    assert set(value) <= declared, f"undeclared keys {set(value) - declared}"
    assert required <= set(value), f"missing keys {required - set(value)}"


def validate_typed(annotation: Any, value: Any) -> Any:
    """Validate against an SDK parameter type, items of `Iterable[...]` fields too.

    pydantic validates `Iterable` fields lazily, so the result is walked while the
    adapter is still alive (its validators die with it).
    """
    adapter = TypeAdapter(annotation)
    return _materialise(adapter.validate_python(value))


def _materialise(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _materialise(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_materialise(item) for item in value]
    if isinstance(value, Iterator):
        return [_materialise(item) for item in value]
    return value


def json_text(value: str) -> Any:
    return json.loads(value)


def sdk_literals(annotation: Any) -> set[str]:
    """Every string of the Literal types inside an SDK's type annotation (Optional,
    Union, ...): the values an SDK defines for a `type`, a status or an end reason."""
    if typing.get_origin(annotation) is typing.Literal:
        return {value for value in typing.get_args(annotation) if isinstance(value, str)}
    return set().union(*(sdk_literals(arg) for arg in typing.get_args(annotation)))
