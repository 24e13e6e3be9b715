"""The values a turn is made of (pure): the driver's request and response, usage,
a recorded step, a turn's options. Frozen, so a checkpoint cannot change after
it was written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from executor.core.types import ProposedCall

JSON_MODE = "json"
"""A driver without native tool calling: the model answers with the JSON contract."""

Purpose = Literal["turn", "audit"]


class StepOutcome(StrEnum):
    """What one model step decided, as checkpointed in `toolfence_turn_steps`."""

    TOOL_CALLS = "tool_calls"
    FINAL = "final"
    NOTHING = "nothing"  # `{}`, `{"tool_calls": []}`, `{"final": ""}`: nothing more to do
    CONTRACT_ERROR = "contract_error"
    AUDIT = "audit"  # the audit hook's verdict on the step before


class EndReason(StrEnum):
    """Why a turn ended (`end_reason`), stable snake_case like the error codes."""

    FINAL = "final"
    NOTHING_MORE = "nothing_more"
    MAX_STEPS = "max_steps"
    CALL_BUDGET_EXCEEDED = "call_budget_exceeded"
    CONTRACT_ERROR = "contract_error"
    DRIVER_FAILED = "driver_failed"
    AUDIT_SUPPRESSED = "audit_suppressed"
    AUDIT_ASK_USER = "audit_ask_user"
    AUDIT_FAILED = "audit_failed"
    # The provider's response was refused by its surface's adapter (`truncated_response`,
    # a paused, filtered or failed response, ...): the adapter's code is in `error`.
    RESPONSE_REFUSED = "response_refused"
    # The provider ran a hosted call the application's HostedPolicy does not allow.
    HOSTED_CALL_NOT_ALLOWED = "hosted_call_not_allowed"
    # The provider paused a hosted MCP call for an approval a turn cannot answer.
    HOSTED_APPROVAL_REQUIRED = "hosted_approval_required"
    # The turn's surface turns writes into approvals: a write of the last step waits
    # for a person, and the turn's answer is the card (executor/core/surfaces.py).
    APPROVAL_CARD = "approval_card"
    # The turn's context names a surface the worker's registry does not declare.
    UNKNOWN_SURFACE = "unknown_surface"


@dataclass(frozen=True)
class Usage:
    """One model call's usage record. `cost_usd` is None when the driver cannot tell."""

    model: str
    purpose: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    latency_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "purpose": self.purpose, "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens, "cost_usd": self.cost_usd,
            "latency_seconds": round(self.latency_seconds, 6),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Usage:
        return cls(
            model=str(data.get("model", "")), purpose=str(data.get("purpose", "")),
            input_tokens=int(data.get("input_tokens") or 0),
            output_tokens=int(data.get("output_tokens") or 0),
            cost_usd=data.get("cost_usd"), latency_seconds=float(data.get("latency_seconds") or 0.0),
        )


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model is shown it: exactly the tools admission would admit for
    the requester (`exposed_to`), never more."""

    name: str
    description: str
    mode: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    """One call in: the purpose, the assembled prompt, the exported tools.

    `call_index` counts this turn's calls of this purpose (1-based), the same on
    every attempt at the same step: a scripted driver replays by it. `surface`
    names the provider surface of a native driver (its tools are exported in that
    surface's format into `native_tools`); JSON-contract drivers get the tools in
    the prompt's text. `max_continuations`: how many more requests a driver may
    send to continue a response the provider paused (Anthropic `pause_turn`),
    what is left of the turn's step budget."""

    purpose: Purpose
    prompt: str
    tools: tuple[ToolSpec, ...]
    turn_id: str
    call_index: int
    native_tools: tuple[Mapping[str, Any], ...] = ()
    read_only_tools: bool = False
    max_continuations: int = 0


@dataclass(frozen=True)
class ModelResponse:
    """One response out: text (the JSON contract) or a provider response as the SDK
    serialises it (native mode), and the usage record. Never stored raw."""

    usage: Usage
    text: str | None = None
    raw: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class StepRecord:
    """One checkpointed model step."""

    step: int
    outcome: StepOutcome
    proposals: tuple[ProposedCall, ...]
    request_id: str
    usage: Usage
    final_output: str | None = None
    error: Mapping[str, Any] | None = None
    verdict: str | None = None  # an AUDIT step's verdict (executor.turns.audit.Verdict)
    # The ids of the items the turn's surface listed at this step (None: none listed):
    # the step's calls are admitted with them as the context's `offered`.
    offered: tuple[str, ...] | None = None
    # The W3C context of the step's `chat` span (tracing on): its calls join it.
    trace_context: str | None = None


@dataclass(frozen=True)
class TurnOptions:
    """What the application set for one turn (stored with it, so a resumed turn keeps
    its limits). `fallback_output` is what the user is told when the loop fails."""

    max_steps: int = 8
    max_calls: int = 16
    fallback_output: str = "Sorry, I could not finish this request."
    audit_driver: str | None = None
    audit_timeout_seconds: float = 20.0

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.max_calls < 0:
            raise ValueError("max_steps must be at least 1 and max_calls not negative")

    def to_json(self) -> dict[str, Any]:
        return {
            "max_steps": self.max_steps, "max_calls": self.max_calls,
            "fallback_output": self.fallback_output, "audit_driver": self.audit_driver,
            "audit_timeout_seconds": self.audit_timeout_seconds,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TurnOptions:
        return cls(
            max_steps=int(data.get("max_steps", 8)), max_calls=int(data.get("max_calls", 16)),
            fallback_output=str(data.get("fallback_output", cls.fallback_output)),
            audit_driver=data.get("audit_driver"),
            audit_timeout_seconds=float(data.get("audit_timeout_seconds", 20.0)),
        )


def step_request_id(turn_id: str, step: int) -> str:
    """The request id of a step's calls: operation ids derive from (tenant, request,
    call), so from (turn, step, call), and a resumed turn re-enqueues the same ones."""
    return f"{turn_id}.s{step}"
