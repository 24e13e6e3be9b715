"""Typed values the store's statements take and return (frozen dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from executor.core.approvers import ApproverRefusal
from executor.core.states import ApprovalState, State
from executor.core.tools import Mode

# The store's kind of error, defined with the family; importable from here as before.
from executor.errors import StoreError as StoreError


@dataclass(frozen=True)
class NewOperation:
    operation_id: str
    request_id: str
    call_id: str
    position: int
    tool_name: str
    schema_version: int
    mode: Mode
    intent_hash: str
    arguments: dict[str, Any]
    context: dict[str, Any]
    needs_approval: bool
    impact: dict[str, Any] | None
    approval_ttl_seconds: float = 24 * 3600.0
    approved_resources: frozenset[str] | None = None
    tenant: str = ""
    conversation_id: str | None = None
    trace_context: str | None = None


@dataclass(frozen=True)
class Created:
    operation_id: str
    state: State
    approval_id: str | None


@dataclass(frozen=True)
class Reused:
    """Same operation id, same intent, already terminal: the stored outcome is returned."""

    operation_id: str
    state: State


@dataclass(frozen=True)
class InProgress:
    operation_id: str
    state: State


@dataclass(frozen=True)
class Conflict:
    operation_id: str


RegisterOutcome = Created | Reused | InProgress | Conflict


@dataclass(frozen=True)
class Reservation:
    operation_id: str
    generation: int
    owner_token: str
    lease_expires_at: float
    attempts: int
    took_over: bool


class Completion(NamedTuple):
    """What `operations.complete_counted` answers: whether its CAS won, and (asked
    for, and won) the operation's distinct accepted receipts."""

    won: bool
    accepted_receipts: int | None


@dataclass(frozen=True)
class StaleOperation:
    operation_id: str
    generation: int
    tool_name: str
    lease_expires_at: float
    trace_context: str | None = None


@dataclass(frozen=True)
class ApprovalRecord:
    approval_id: str
    operation_id: str
    intent_hash: str
    impact: dict[str, Any]
    state: ApprovalState
    requested_at: float
    expires_at: float


@dataclass(frozen=True)
class HostedApprovalRecord:
    """One hosted approval (`toolfence_hosted_approvals`): an `mcp_approval_request`
    toolfence decides. `impact` is the redacted summary of the provider's arguments."""

    approval_id: str
    tenant: str
    request_id: str
    approval_request_id: str
    surface: str
    server_label: str
    tool_name: str
    intent_hash: str
    impact: dict[str, Any]
    requester: dict[str, Any]
    state: ApprovalState
    requested_at: float
    expires_at: float
    decided_at: float | None
    decided_by: str | None
    reason: str | None


class DecisionOutcome(StrEnum):
    DECIDED = "decided"
    # No such approval, or no longer pending (decided, expired): nothing changed.
    NOT_PENDING = "not_pending"
    # The approver may not decide it: audited, the approval stays pending.
    APPROVER_NOT_ALLOWED = "approver_not_allowed"


@dataclass(frozen=True)
class Decision:
    """What `approve` or `deny` did; `refusal` says why an approver was refused."""

    outcome: DecisionOutcome
    tool_name: str | None = None
    refusal: ApproverRefusal | None = None

    @property
    def decided(self) -> bool:
        return self.outcome is DecisionOutcome.DECIDED


@dataclass(frozen=True, slots=True)
class OperationRow:
    """One row of `toolfence_operations`, typed: what the worker, the reconciler and
    the readers get instead of an untyped SQLAlchemy row. Text columns holding
    JSON (`arguments`, `context`, `result`, `error`, `impact`,
    `approved_resources`) stay text here;
    the reader that needs them decodes them."""

    operation_id: str
    request_id: str
    call_id: str
    position: int
    tool_name: str
    schema_version: int
    mode: str
    state: str
    generation: int
    owner_token: str | None
    lease_expires_at: float | None
    intent_hash: str
    arguments: str
    context: str
    attempts: int
    available_at: float
    queued_at: float | None
    result: str | None
    receipt: str | None
    error_code: str | None
    error: str | None
    impact: str | None
    created_at: float
    updated_at: float
    started_at: float | None
    finished_at: float | None
    approved_resources: str | None = None
    tenant: str = ""
    conversation_id: str | None = None
    trace_context: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> OperationRow:
        return cls(**row._mapping)
