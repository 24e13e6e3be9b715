"""Approvals: single-use decisions bound to the intent hash they were requested for."""

from __future__ import annotations

import json

from sqlalchemy import (
    Connection,
    select,
    update,
)

from executor.core.states import State
from executor.core.types import ErrorCode
from executor.store.audit import AUDIT_COLUMNS, append_event, dumps
from executor.store.clock import DATABASE_CLOCK, Clock
from executor.store.intake import add_outbox_row
from executor.store.ordering import release_successors
from executor.store.records import ApprovalRecord, StoreError
from executor.store.schema import approvals, operations


def get_approval(conn: Connection, approval_id: str) -> ApprovalRecord | None:
    row = conn.execute(select(approvals).where(approvals.c.approval_id == approval_id)).one_or_none()
    if row is None:
        return None
    return ApprovalRecord(
        row.approval_id, row.operation_id, row.intent_hash, json.loads(row.impact), row.state,
        row.requested_at, row.expires_at,
    )


def approval_for_operation(conn: Connection, operation_id: str) -> ApprovalRecord | None:
    approval_id = conn.execute(
        select(approvals.c.approval_id).where(approvals.c.operation_id == operation_id)
    ).scalar_one_or_none()
    return None if approval_id is None else get_approval(conn, approval_id)


def approve(
    conn: Connection,
    approval_id: str,
    *,
    approver: str,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """pending_approval → queued. Single use: the approval row's CAS on `pending`.

    The approval stays bound to the intent hash it was requested for; the worker
    refuses with `approval_invalidated` if the intent computed at run time differs.
    """
    now = clock.now()
    decided = conn.execute(
        update(approvals)
        .where(
            approvals.c.approval_id == approval_id,
            approvals.c.state == "pending",
            approvals.c.expires_at > now,
        )
        .values(state="approved", decided_at=now, decided_by=approver)
        .returning(approvals.c.operation_id, approvals.c.intent_hash)
    ).one_or_none()
    if decided is None:
        return False
    row = conn.execute(
        update(operations)
        .where(
            operations.c.operation_id == decided.operation_id,
            operations.c.state == State.PENDING_APPROVAL.value,
            operations.c.intent_hash == decided.intent_hash,
        )
        .values(state=State.QUEUED.value, queued_at=now, available_at=now, updated_at=now)
        .returning(*AUDIT_COLUMNS)
    ).one_or_none()
    if row is None:
        raise StoreError(f"approval {approval_id} does not match its operation's intent")
    append_event(conn, row, State.PENDING_APPROVAL, State.QUEUED, "approved", clock, actor=approver)
    add_outbox_row(conn, decided.operation_id, clock)
    return True


def deny(
    conn: Connection,
    approval_id: str,
    *,
    approver: str,
    reason: str,
    expired: bool = False,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """pending_approval → failed_terminal (`approval_denied`); also used for expiry."""
    now = clock.now()
    conditions = [approvals.c.approval_id == approval_id, approvals.c.state == "pending"]
    if expired:
        conditions.append(approvals.c.expires_at <= now)
    decided = conn.execute(
        update(approvals)
        .where(*conditions)
        .values(
            state="expired" if expired else "denied",
            decided_at=now,
            decided_by=approver,
            reason=reason,
        )
        .returning(approvals.c.operation_id)
    ).one_or_none()
    if decided is None:
        return False
    row = conn.execute(
        update(operations)
        .where(
            operations.c.operation_id == decided.operation_id,
            operations.c.state == State.PENDING_APPROVAL.value,
        )
        .values(
            state=State.FAILED_TERMINAL.value,
            error_code=ErrorCode.APPROVAL_DENIED.value,
            error=dumps({"message": "approval expired" if expired else "approval denied"}),
            finished_at=now,
            updated_at=now,
        )
        .returning(*AUDIT_COLUMNS)
    ).one_or_none()
    if row is None:
        raise StoreError(f"approval {approval_id} has no operation waiting for it")
    append_event(
        conn, row, State.PENDING_APPROVAL, State.FAILED_TERMINAL,
        "approval_expired" if expired else ErrorCode.APPROVAL_DENIED.value, clock, actor=approver,
    )
    release_successors(conn, decided.operation_id, clock)
    return True


def expired_approvals(conn: Connection, limit: int, clock: Clock = DATABASE_CLOCK) -> list[str]:
    return list(
        conn.execute(
            select(approvals.c.approval_id)
            .where(approvals.c.state == "pending", approvals.c.expires_at <= clock.now())
            .limit(limit)
        ).scalars()
    )
