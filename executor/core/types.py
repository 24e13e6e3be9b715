"""Neutral value types shared by admission, the store, the fleet and the adapters.

Nothing here does I/O. Every value is frozen: a result or a context that could be
mutated after admission would make the audit trail a lie.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ErrorCode(StrEnum):
    """Stable error codes (docs/design.md §Results and error codes).

    Callers branch on these, never on messages."""

    UNKNOWN_TOOL = "unknown_tool"
    TOOL_NOT_ALLOWED = "tool_not_allowed"
    INVALID_ARGUMENTS_JSON = "invalid_arguments_json"
    INVALID_ARGUMENTS = "invalid_arguments"
    BUSINESS_RULE_VIOLATION = "business_rule_violation"
    PERMISSION_DENIED = "permission_denied"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_INVALIDATED = "approval_invalidated"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    OPERATION_IN_PROGRESS = "operation_in_progress"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    EXECUTION_FAILED = "execution_failed"
    TIMEOUT = "timeout"
    RECONCILIATION_PENDING = "reconciliation_pending"
    RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"
    INVALID_RESULT = "invalid_result"
    PREDECESSOR_FAILED = "predecessor_failed"
    # wave 2
    TRUNCATED_RESPONSE = "truncated_response"
    # wave 3: a provider response that ended other than finished (docs/providers.md)
    FILTERED_RESPONSE = "filtered_response"
    UNFINISHED_RESPONSE = "unfinished_response"
    HOSTED_CALL_NOT_ALLOWED = "hosted_call_not_allowed"
    APPROVAL_SCOPE_EXCEEDED = "approval_scope_exceeded"
    APPROVER_NOT_ALLOWED = "approver_not_allowed"
    REPEATED_FAILED_CALL = "repeated_failed_call"
    CALL_BUDGET_EXCEEDED = "call_budget_exceeded"
    # A call id, tool name or operation id that no database can hold or no
    # terminal can print (executor/core/identifiers.py): answered per call.
    INVALID_IDENTIFIER = "invalid_identifier"
    TURN_IN_PROGRESS = "turn_in_progress"
    # A listed argument names an item the server did not list (executor/core/surfaces.py)
    TARGET_NOT_OFFERED = "target_not_offered"
    # `sandbox.run_python` (executor/sandbox): a limit the program passed, or no sandbox
    SANDBOX_TIMEOUT = "sandbox_timeout"
    SANDBOX_MEMORY_LIMIT = "sandbox_memory_limit"
    SANDBOX_OUTPUT_LIMIT = "sandbox_output_limit"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    # `toolfence serve`: the codes of its problem+json answers (no call result has them)
    UNAUTHENTICATED = "unauthenticated"
    NOT_FOUND = "not_found"
    IDENTITY_IN_BODY = "identity_in_body"
    INVALID_REQUEST = "invalid_request"
    REQUEST_TOO_LARGE = "request_too_large"
    RATE_LIMITED = "rate_limited"
    NOT_PENDING = "not_pending"
    # An approval decided on an impact that has changed since it was shown (decision 0222)
    IMPACT_CHANGED = "impact_changed"
    NOT_READY = "not_ready"
    TURNS_NOT_CONFIGURED = "turns_not_configured"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ErrorDetail(_Frozen):
    """One safe detail: where, what kind of problem, what was expected.

    Never the rejected value itself: it may be a secret or an injection payload.
    """

    path: str
    code: str
    expected: str | None = None


class ToolError(_Frozen):
    code: ErrorCode
    message: str
    details: tuple[ErrorDetail, ...] = ()


class ProposedCall(_Frozen):
    """A call as the model proposed it. `arguments` is the raw text the model wrote
    (bytes when a transport hands us undecoded input)."""

    call_id: str
    tool_name: str
    arguments: str | bytes | dict[str, Any]


class ServerContext(_Frozen):
    """Who is asking, as established by the application's own authentication.

    Built by the server, never from model output: authorization reads only this.
    `request_id` is scoped by `tenant`. `conversation_id` names the application's
    conversation (repeated writes and call budgets are counted over it as well as
    over the request); `turn_id` is carried for correlation.

    `surface` names a turn surface of the registry (`executor.core.surfaces`): its
    catalog narrows what is shown and runnable, and its write rule applies, at
    admission and again when the call runs. `offered` is what the server listed to
    the model (the target ids a tool's listed argument may name); None is "nothing
    was listed". Both are the server's, like the roles: never model output.
    """

    principal: str
    tenant: str
    roles: frozenset[str] = frozenset()
    request_id: str
    conversation_id: str | None = None
    turn_id: str | None = None
    surface: str | None = None
    offered: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "principal": self.principal,
            "tenant": self.tenant,
            "roles": sorted(self.roles),
            "request_id": self.request_id,
            "conversation_id": self.conversation_id,
            "turn_id": self.turn_id,
        }
        # Only when set: a context without a surface is stored as it always was.
        if self.surface is not None:
            data["surface"] = self.surface
        if self.offered is not None:
            data["offered"] = list(self.offered)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerContext:
        offered = data.get("offered")
        return cls(
            principal=data["principal"],
            tenant=data["tenant"],
            roles=frozenset(data.get("roles", ())),
            request_id=data["request_id"],
            conversation_id=data.get("conversation_id"),
            turn_id=data.get("turn_id"),
            surface=data.get("surface"),
            offered=None if offered is None else tuple(offered),
        )


# `reused_from_call_id` on a status: this call repeated an earlier write of its request
# or conversation and was answered from that call's operation, which did not run again.


class Succeeded(_Frozen):
    status: Literal["succeeded"] = "succeeded"
    call_id: str
    tool_name: str
    operation_id: str | None = None
    output: Any = None
    untrusted: bool = False
    # Freshness (epoch seconds). None on results stored before these fields existed,
    # and on results an application builds itself: "not known", never "fresh".
    # `observed_at` is the database clock when the completing statement recorded the
    # downstream's answer; `source_time` the source's own timestamp, on its clock.
    # `age_seconds` is measured on the database clock when the result is read, and
    # `stale` is true once that age passes the tool's `max_age_seconds`.
    observed_at: float | None = None
    source_time: float | None = None
    age_seconds: float | None = None
    stale: bool | None = None
    reused_from_call_id: str | None = None


class FailedRetryable(_Frozen):
    status: Literal["failed_retryable"] = "failed_retryable"
    call_id: str
    tool_name: str
    operation_id: str | None = None
    error: ToolError
    reused_from_call_id: str | None = None


class FailedTerminal(_Frozen):
    status: Literal["failed_terminal"] = "failed_terminal"
    call_id: str
    tool_name: str
    operation_id: str | None = None
    error: ToolError
    reused_from_call_id: str | None = None


CallResult = Annotated[Succeeded | FailedRetryable | FailedTerminal, Field(discriminator="status")]


class Pending(_Frozen):
    """Not a result: the call has no terminal outcome yet.

    `state` is the operation's state; `impact` is set while an approval is awaited.
    """

    status: Literal["pending"] = "pending"
    call_id: str
    tool_name: str
    operation_id: str
    state: str
    impact: dict[str, Any] | None = None
    approval_id: str | None = None
    reused_from_call_id: str | None = None


CallStatus = Annotated[
    Succeeded | FailedRetryable | FailedTerminal | Pending, Field(discriminator="status")
]

