"""Reads of operations for the worker, the CLI, results and the reconciler's sweeps
(no state changes)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Select,
    and_,
    bindparam,
    case,
    false,
    func,
    or_,
    select,
)

from executor.core.admission import Gate
from executor.core.budgets import Usage
from executor.core.states import State
from executor.core.tools import Mode
from executor.store.clock import DATABASE_CLOCK, Clock
from executor.store.ordering import runnable_queued, sql_literal
from executor.store.records import OperationRow, StaleOperation
from executor.store.schema import audit_events, calls, operations

# The audit decision of `started → retry_wait` when the worker gave an operation back
# before its handler ran (the database was unreachable during the re-check).
RELEASED_BEFORE_RUN = "released_before_run"


_BY_ID = select(operations).where(operations.c.operation_id == bindparam("operation_id"))


def get_operation(conn: Connection, operation_id: str) -> OperationRow | None:
    row = conn.execute(_BY_ID, {"operation_id": operation_id}).one_or_none()
    return None if row is None else OperationRow.from_row(row)


def operations_in(conn: Connection, operation_ids: Iterable[str]) -> dict[str, OperationRow]:
    ids = list(operation_ids)
    if not ids:
        return {}
    return {
        r.operation_id: OperationRow.from_row(r)
        for r in conn.execute(select(operations).where(operations.c.operation_id.in_(ids)))
    }


def earlier_attempt_may_have_run(conn: Connection, operation_id: str, generation: int) -> bool:
    """Whether a generation before `generation` may have invoked the handler.

    Every generation that reached `started` got past the execution-time re-check,
    unless it was given back `released_before_run`; a refusal ends the operation,
    so no later generation follows it. Conservative: a generation killed before
    its handler ran counts as one that may have run (nothing durable says it did not).
    """
    trail = conn.execute(
        select(audit_events.c.generation, audit_events.c.from_state, audit_events.c.to_state,
               audit_events.c.decision_code)
        .where(audit_events.c.operation_id == operation_id, audit_events.c.generation < generation)
    ).all()
    started = {r.generation for r in trail if r.to_state == State.STARTED.value}
    released = {
        r.generation for r in trail
        if r.from_state == State.STARTED.value and r.decision_code == RELEASED_BEFORE_RUN
    }
    return bool(started - released)


def lease_remaining(conn: Connection, operation_id: str, clock: Clock = DATABASE_CLOCK) -> float | None:
    """Seconds until a `started` operation's lease expires, on the database clock."""
    return conn.execute(
        select(operations.c.lease_expires_at - clock.now()).where(
            operations.c.operation_id == operation_id,
            operations.c.state == State.STARTED.value,
        )
    ).scalar_one_or_none()


def calls_of_request(conn: Connection, tenant: str, request_id: str) -> dict[str, Row[Any]]:
    """call id → its row, for one request of one tenant."""
    rows = conn.execute(_CALLS_OF_REQUEST, {"tenant": tenant, "request_id": request_id}).all()
    return {row.call_id: row for row in rows}


_CALLS_OF_REQUEST = select(calls).where(
    calls.c.tenant == bindparam("tenant"), calls.c.request_id == bindparam("request_id")
)


def scope_usage(
    conn: Connection,
    tenant: str,
    *,
    tool_name: str,
    write_tools: Iterable[str],
    request_id: str | None = None,
    conversation_id: str | None = None,
) -> Usage:
    """What one scope (a request, or a conversation) already holds, for its budget.

    Counted from the calls table inside the caller's transaction, so the earlier
    calls of the batch being enqueued count too; calls refused by a budget do not.
    """
    writes = list(write_tools)
    row = conn.execute(
        _usage_statement(by_conversation=conversation_id is not None, any_writes=bool(writes)),
        {
            "tenant": tenant, "scope": request_id if conversation_id is None else conversation_id,
            "tool_name": tool_name, "write_tools": writes,
        },
    ).one()
    return Usage(
        calls=int(row.calls), writes=int(row.writes), tool_calls=int(row.tool_calls),
        repeated_failures=int(row.failures),
    )


@functools.cache
def _usage_statement(*, by_conversation: bool, any_writes: bool) -> Select[Any]:
    """`scope_usage`'s query, built once per scope kind (`:tenant`, `:scope`,
    `:tool_name`, `:write_tools`)."""
    scope = (calls.c.conversation_id if by_conversation else calls.c.request_id) == bindparam("scope")
    # Refused by a budget, or a provider-run call reported on the request: not a
    # call toolfence was asked to run, so not one the budget counts.
    counted = or_(calls.c.gate.is_(None), calls.c.gate.not_in([Gate.BUDGET.value, Gate.HOSTED.value]))

    def total(condition: ColumnElement[bool]) -> ColumnElement[Any]:
        return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)

    writes = (
        calls.c.tool_name.in_(bindparam("write_tools", expanding=True)) if any_writes else false()
    )
    return select(
        func.count().label("calls"),
        total(writes).label("writes"),
        total(calls.c.tool_name == bindparam("tool_name")).label("tool_calls"),
        total(and_(calls.c.gate == Gate.REPEAT.value, calls.c.result.is_not(None))).label("failures"),
    ).where(calls.c.tenant == bindparam("tenant"), scope, counted)


def earlier_write(
    conn: Connection, tenant: str, request_id: str, conversation_id: str | None, intent_hash: str
) -> OperationRow | None:
    """The first write of this request or conversation with this intent, if any."""
    scope = operations.c.request_id == request_id
    if conversation_id is not None:
        scope = or_(scope, operations.c.conversation_id == conversation_id)
    row = conn.execute(
        select(operations)
        .where(
            operations.c.tenant == tenant,
            operations.c.mode == Mode.WRITE.value,
            operations.c.intent_hash == intent_hash,
            scope,
        )
        .order_by(operations.c.created_at, operations.c.position)
        .limit(1)
    ).one_or_none()
    return None if row is None else OperationRow.from_row(row)


def due_retries(conn: Connection, limit: int, clock: Clock = DATABASE_CLOCK) -> list[str]:
    """Operation ids in `retry_wait` whose backoff has passed (partial index)."""
    return list(
        conn.execute(
            select(operations.c.operation_id)
            .where(
                operations.c.state == sql_literal(State.RETRY_WAIT),
                operations.c.available_at <= clock.now(),
            )
            .order_by(operations.c.available_at)
            .limit(limit)
        ).scalars()
    )


def stale_started(
    conn: Connection,
    limit: int,
    clock: Clock = DATABASE_CLOCK,
    *,
    skip_locked: bool = False,
) -> list[StaleOperation]:
    """`started` operations whose lease expired (partial index on lease_expires_at)."""
    query = (
        select(
            operations.c.operation_id,
            operations.c.generation,
            operations.c.tool_name,
            operations.c.lease_expires_at,
            operations.c.trace_context,
        )
        .where(
            operations.c.state == sql_literal(State.STARTED),
            operations.c.lease_expires_at < clock.now(),
        )
        .order_by(operations.c.lease_expires_at)
        .limit(limit)
    )
    if skip_locked:
        query = query.with_for_update(skip_locked=True)
    return [
        StaleOperation(r.operation_id, r.generation, r.tool_name, r.lease_expires_at, r.trace_context)
        for r in conn.execute(query)
    ]


def stale_queued(
    conn: Connection, older_than_seconds: float, limit: int, clock: Clock = DATABASE_CLOCK
) -> list[str]:
    """`queued` operations waiting longer than a threshold: their message may be lost.

    Only runnable ones (`runnable_queued`): one still waiting for an earlier call has
    no message by design, and gets one when that call settles.
    """
    return list(
        conn.execute(
            select(operations.c.operation_id)
            .where(
                runnable_queued(operations),
                operations.c.queued_at < clock.now() - older_than_seconds,
            )
            .order_by(operations.c.queued_at)
            .limit(limit)
        ).scalars()
    )
