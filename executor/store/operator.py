"""What a person sees and does: the approval queue, the `reconciliation_pending`
queue, one operation's record, and an operator's resolution.

One home for the CLI (`toolfence approvals|pending|show|resolve`) and the HTTP
API and console (`toolfence serve`): each lists and resolves through these, so the
two never disagree on what is pending or what a resolution writes. `tenant=None`
(the CLI, run by whoever holds the database) lists every tenant's; the server
always passes the caller's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, select

from executor.core.states import ApprovalState, State
from executor.store.audit import audit_trail
from executor.store.clock import read_now
from executor.store.operations import resolve
from executor.store.ordering import sql_literal
from executor.store.reads import get_operation
from executor.store.receipts import distinct_accepted_receipts, record_receipt
from executor.store.records import OperationRow
from executor.store.schema import approvals, calls, operations, receipts


@dataclass(frozen=True)
class PendingApproval:
    """A call waiting for a person, with what the server computed for her."""

    approval_id: str
    operation_id: str
    request_id: str
    call_id: str
    tool_name: str
    requester: str
    tenant: str
    impact: dict[str, Any]
    resources: list[str] | None  # the set a write declaring `resources` was approved for
    arguments: dict[str, Any]
    context: dict[str, Any]
    intent_hash: str
    requested_at: float
    expires_at: float
    age_seconds: float


def pending_approvals(
    conn: Connection, tenant: str | None = None, approval_id: str | None = None
) -> list[PendingApproval]:
    query = (
        select(
            approvals, operations.c.tool_name, operations.c.call_id, operations.c.request_id,
            operations.c.tenant, operations.c.context, operations.c.approved_resources,
            operations.c.arguments,
        )
        .join(operations, operations.c.operation_id == approvals.c.operation_id)
        .where(approvals.c.state == sql_literal(ApprovalState.PENDING))  # ix_toolfence_approvals_pending
        .order_by(approvals.c.requested_at)
    )
    if tenant is not None:
        query = query.where(operations.c.tenant == tenant)
    if approval_id is not None:
        query = query.where(approvals.c.approval_id == approval_id)
    rows = conn.execute(query).all()
    now = read_now(conn) if rows else 0.0
    return [
        PendingApproval(
            approval_id=r.approval_id, operation_id=r.operation_id, request_id=r.request_id,
            call_id=r.call_id, tool_name=r.tool_name,
            requester=str(json.loads(r.context).get("principal", "")), tenant=r.tenant,
            impact=json.loads(r.impact),
            resources=json.loads(r.approved_resources) if r.approved_resources else None,
            arguments=json.loads(r.arguments), context=json.loads(r.context),
            intent_hash=r.intent_hash, requested_at=r.requested_at, expires_at=r.expires_at,
            age_seconds=max(0.0, now - r.requested_at),
        )
        for r in rows
    ]


def approval_tenant(conn: Connection, approval_id: str) -> str | None:
    """The tenant of an operation approval's operation (None: no such approval)."""
    return conn.execute(
        select(operations.c.tenant)
        .join(approvals, approvals.c.operation_id == operations.c.operation_id)
        .where(approvals.c.approval_id == approval_id)
    ).scalar_one_or_none()


def operation_cause(row: Any) -> str | None:
    """Why an operation is where it is, as a stable code: the cause its error names
    (a write beyond its approved set: `approval_scope_exceeded`), else the first
    detail at path "" (an MCP call's `mcp_timeout`, `mcp_connection_lost`, ...),
    else its error code."""
    code = str(row.error_code) if row.error_code else None
    error = json.loads(row.error) if row.error else {}
    if not isinstance(error, dict):
        return code
    if error.get("cause"):
        return str(error["cause"])
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and detail.get("path") == "" and detail.get("code"):
            return str(detail["code"])
    return code


def operation_reason(row: Any) -> str | None:
    return json.loads(row.error).get("message") if row.error else None


def reconciliation_pending(
    conn: Connection, tenant: str | None = None, limit: int = 100
) -> list[OperationRow]:
    """Operations waiting for a person, oldest first."""
    query = (
        select(operations)
        .where(operations.c.state == sql_literal(State.RECONCILIATION_PENDING))  # the active index
        .order_by(operations.c.updated_at)
        .limit(limit)
    )
    if tenant is not None:
        query = query.where(operations.c.tenant == tenant)
    return [OperationRow.from_row(r) for r in conn.execute(query)]


def receipts_of(conn: Connection, operation_id: str) -> list[Row[Any]]:
    return list(
        conn.execute(
            select(receipts)
            .where(receipts.c.operation_id == operation_id)
            .order_by(receipts.c.receipt_row_id)
        )
    )


@dataclass(frozen=True)
class OperationRecord:
    """One operation as an operator reads it."""

    row: OperationRow
    audit: list[Row[Any]]
    receipts: list[Row[Any]]
    side_effects: int
    request_calls: list[Row[Any]]


def operation_record(
    conn: Connection, operation_id: str, tenant: str | None = None
) -> OperationRecord | None:
    """None when there is no such operation, or it belongs to another tenant than
    `tenant` (answered alike: another tenant's ids do not exist for the caller)."""
    row = get_operation(conn, operation_id)
    if row is None or (tenant is not None and row.tenant != tenant):
        return None
    request_calls = list(
        conn.execute(
            select(calls)
            .where(calls.c.tenant == row.tenant, calls.c.request_id == row.request_id)
            .order_by(calls.c.position)
        )
    )
    return OperationRecord(
        row=row, audit=audit_trail(conn, operation_id), receipts=receipts_of(conn, operation_id),
        side_effects=distinct_accepted_receipts(conn, operation_id), request_calls=request_calls,
    )


RESOLUTIONS = {"succeeded": State.SUCCEEDED, "failed": State.FAILED_TERMINAL, "requeue": State.QUEUED}


def resolve_pending(
    conn: Connection,
    operation_id: str,
    *,
    outcome: str,
    actor: str,
    reference: str | None,
    note: str = "",
) -> bool:
    """A person's resolution of a `reconciliation_pending` operation: succeeded (with
    the downstream's reference, recorded as its receipt), failed, or requeue.
    False when the operation is not `reconciliation_pending` (nothing written)."""
    to_state = RESOLUTIONS[outcome]
    if to_state is State.SUCCEEDED and not reference:
        raise ValueError("resolving as succeeded needs the downstream's reference")
    won = resolve(
        conn, operation_id, to_state=to_state, actor=actor, reference=reference, message=note,
    )
    if won and to_state is State.SUCCEEDED and reference:
        resolved = get_operation(conn, operation_id)
        assert resolved is not None
        record_receipt(conn, operation_id, resolved.generation, reference, accepted=True, source="operator")
    return won
