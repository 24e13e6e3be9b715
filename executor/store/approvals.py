"""Approvals: single-use decisions bound to the intent hash they were requested for.

`approve` and `deny` take the approver as a `ServerContext` and the registry, and
ask `approver_refusal` (executor/core/approvers.py) before deciding, in the same
transaction: every path that decides an approval (CLI, demo, an API) goes through
this check. A refused approver changes nothing but the audit trail.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    select,
    update,
)

from executor.core.approvers import (
    ApprovalDecision,
    ApprovalSubject,
    ApproverRefusal,
    approver_refusal,
)
from executor.core.states import ApprovalState, State
from executor.core.tools import Registry, RoleResolutionFailed
from executor.core.types import ErrorCode, ServerContext
from executor.store.audit import dumps
from executor.store.clock import DATABASE_CLOCK, Clock
from executor.store.operations import _transition
from executor.store.records import ApprovalRecord, Decision, DecisionOutcome, StoreError
from executor.store.schema import approvals, operations


def get_approval(conn: Connection, approval_id: str) -> ApprovalRecord | None:
    row = conn.execute(select(approvals).where(approvals.c.approval_id == approval_id)).one_or_none()
    if row is None:
        return None
    return ApprovalRecord(
        row.approval_id, row.operation_id, row.intent_hash, json.loads(row.impact),
        ApprovalState(row.state), row.requested_at, row.expires_at,
    )


def approval_for_operation(conn: Connection, operation_id: str) -> ApprovalRecord | None:
    approval_id = conn.execute(
        select(approvals.c.approval_id).where(approvals.c.operation_id == operation_id)
    ).scalar_one_or_none()
    return None if approval_id is None else get_approval(conn, approval_id)


def _decide(
    conn: Connection,
    approval_id: str,
    *fence: ColumnElement[bool],
    decision: ApprovalState,
    approver: str,
    reason: str | None = None,
    clock: Clock,
) -> Row[Any] | None:
    """The approval row's CAS: `pending` → `decision`, once. Returns the operation id
    and intent hash it was requested for, or None when it was no longer pending."""
    now = clock.now()
    return conn.execute(
        update(approvals)
        .where(
            approvals.c.approval_id == approval_id,
            approvals.c.state == ApprovalState.PENDING.value,
            *fence,
        )
        .values(state=decision.value, decided_at=now, decided_by=approver, reason=reason)
        .returning(approvals.c.operation_id, approvals.c.intent_hash)
    ).one_or_none()


def _check_approver(
    conn: Connection,
    approval_id: str,
    approver: ServerContext,
    registry: Registry,
    decision: ApprovalDecision,
    clock: Clock,
) -> Decision | None:
    """None when `approver` may decide the pending approval; else what `approve`/`deny`
    return without deciding. A refusal is audited on the operation (actor: the
    approver's principal, decision `approver_not_allowed`) and leaves it pending."""
    fence = [approvals.c.approval_id == approval_id, approvals.c.state == ApprovalState.PENDING.value]
    if decision is ApprovalDecision.APPROVE:
        fence.append(approvals.c.expires_at > clock.now())
    row = conn.execute(
        select(
            approvals.c.operation_id, operations.c.tool_name, operations.c.context,
            operations.c.arguments, approvals.c.impact,
        )
        .join(operations, operations.c.operation_id == approvals.c.operation_id)
        .where(*fence, operations.c.state == State.PENDING_APPROVAL.value)
    ).one_or_none()
    if row is None:
        return Decision(DecisionOutcome.NOT_PENDING)
    tool = registry.get(row.tool_name)
    subject = ApprovalSubject(
        operation_id=row.operation_id,
        tool_name=row.tool_name,
        requester=ServerContext.from_json(json.loads(row.context)),
        arguments=json.loads(row.arguments),
        impact=json.loads(row.impact),
        decision=decision,
    )
    try:
        current = registry.current_context(approver)
    except RoleResolutionFailed:
        refusal: ApproverRefusal | None = ApproverRefusal.POLICY_FAILED
    else:
        refusal = approver_refusal(None if tool is None else tool.approvers, current, subject)
    if refusal is None:
        return None
    refuse_approver(conn, row.operation_id, actor=approver.principal, clock=clock)
    return Decision(DecisionOutcome.APPROVER_NOT_ALLOWED, row.tool_name, refusal)


def refuse_approver(
    conn: Connection, operation_id: str, *, actor: str, clock: Clock = DATABASE_CLOCK
) -> bool:
    """pending_approval → pending_approval: not a change of state, the audit event of
    an approver the policy refused (`approver_not_allowed`, with who tried)."""
    row = _transition(
        conn, operation_id, State.PENDING_APPROVAL, State.PENDING_APPROVAL,
        values={}, decision=ErrorCode.APPROVER_NOT_ALLOWED.value, clock=clock, actor=actor,
    )
    return row is not None


def _tool_name(conn: Connection, operation_id: str) -> str | None:
    return conn.execute(
        select(operations.c.tool_name).where(operations.c.operation_id == operation_id)
    ).scalar_one_or_none()


def approve(
    conn: Connection,
    approval_id: str,
    *,
    approver: ServerContext,
    registry: Registry,
    clock: Clock = DATABASE_CLOCK,
) -> Decision:
    """pending_approval → queued (with an outbox row), when the tool's approver policy
    allows `approver`. Single use: the approval row's CAS on `pending`.

    The approval stays bound to the intent hash it was requested for; the worker
    refuses with `approval_invalidated` if the intent computed at run time differs.
    """
    refused = _check_approver(conn, approval_id, approver, registry, ApprovalDecision.APPROVE, clock)
    if refused is not None:
        return refused
    decided = _decide(
        conn, approval_id, approvals.c.expires_at > clock.now(),
        decision=ApprovalState.APPROVED, approver=approver.principal, clock=clock,
    )
    if decided is None:
        return Decision(DecisionOutcome.NOT_PENDING)
    now = clock.now()
    row = _transition(
        conn, decided.operation_id, State.PENDING_APPROVAL, State.QUEUED,
        operations.c.intent_hash == decided.intent_hash,
        values={"queued_at": now, "available_at": now},
        decision="approved", clock=clock, actor=approver.principal,
    )
    if row is None:
        raise StoreError(f"approval {approval_id} does not match its operation's intent")
    return Decision(DecisionOutcome.DECIDED, _tool_name(conn, decided.operation_id))


def deny(
    conn: Connection,
    approval_id: str,
    *,
    approver: ServerContext,
    registry: Registry,
    reason: str,
    clock: Clock = DATABASE_CLOCK,
) -> Decision:
    """pending_approval → failed_terminal (`approval_denied`): a person said no. The
    same approver policy as `approve`, except that a requester may withdraw her own call."""
    refused = _check_approver(conn, approval_id, approver, registry, ApprovalDecision.DENY, clock)
    if refused is not None:
        return refused
    decided = _decide(
        conn, approval_id, decision=ApprovalState.DENIED, approver=approver.principal,
        reason=reason, clock=clock,
    )
    if decided is None:
        return Decision(DecisionOutcome.NOT_PENDING)
    _end_unapproved(
        conn, approval_id, decided.operation_id, ErrorCode.APPROVAL_DENIED.value,
        "approval denied", approver.principal, clock,
    )
    return Decision(DecisionOutcome.DECIDED, _tool_name(conn, decided.operation_id))


def expire_approval(
    conn: Connection,
    approval_id: str,
    *,
    approver: str,
    reason: str,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """pending_approval (approval past `expires_at`) → failed_terminal (`approval_denied`):
    nobody decided in time. Loses to a decision made before expiry."""
    decided = _decide(
        conn, approval_id, approvals.c.expires_at <= clock.now(),
        decision=ApprovalState.EXPIRED, approver=approver, reason=reason, clock=clock,
    )
    if decided is None:
        return False
    _end_unapproved(
        conn, approval_id, decided.operation_id, "approval_expired", "approval expired",
        approver, clock,
    )
    return True


def _end_unapproved(
    conn: Connection,
    approval_id: str,
    operation_id: str,
    decision: str,
    message: str,
    approver: str,
    clock: Clock,
) -> None:
    """The operation's side of `deny` and `expire_approval`, once the approval's CAS won."""
    now = clock.now()
    row = _transition(
        conn, operation_id, State.PENDING_APPROVAL, State.FAILED_TERMINAL,
        values={
            "error_code": ErrorCode.APPROVAL_DENIED.value,
            "error": dumps({"message": message}),
            "finished_at": now,
        },
        decision=decision, clock=clock, actor=approver,
    )
    if row is None:
        raise StoreError(f"approval {approval_id} has no operation waiting for it")


def expired_approvals(conn: Connection, limit: int, clock: Clock = DATABASE_CLOCK) -> list[str]:
    return list(
        conn.execute(
            select(approvals.c.approval_id)
            .where(approvals.c.state == ApprovalState.PENDING.value, approvals.c.expires_at <= clock.now())
            .limit(limit)
        ).scalars()
    )
