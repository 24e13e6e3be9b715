"""Registering an operation: the one INSERT that creates it, and its idempotency.

An operation is created exactly once, by `INSERT … ON CONFLICT DO NOTHING` on its
id, in `queued` (with its outbox row, added by the caller's admission) or
`pending_approval` (with its approval row), at generation 0 and with no owner:
ownership is only ever handed out afterwards, by a CAS in `operations`. A second
registration of the same id inserts nothing and reads what the idempotency table
holds: the same intent is reused (terminal) or in progress, a different intent is
a conflict. On PostgreSQL the `admitted` audit event is in the INSERT's statement.
"""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import Connection, Executable, bindparam, func, insert, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from executor.core.states import TERMINAL, ApprovalState, State
from executor.core.tools import Mode
from executor.store.audit import AUDIT_COLUMNS, append_event, dumps, event_from, event_params
from executor.store.clock import DATABASE_CLOCK, Clock, built_once
from executor.store.records import (
    Conflict,
    Created,
    InProgress,
    NewOperation,
    RegisterOutcome,
    Reused,
)
from executor.store.schema import approvals, operations

_REGISTERED_COLUMNS = (
    "operation_id", "tenant", "request_id", "conversation_id", "call_id", "position",
    "tool_name", "schema_version", "mode", "state", "generation", "intent_hash", "arguments",
    "context", "attempts", "available_at", "queued_at", "impact", "approved_resources",
    "created_at", "updated_at", "trace_context",
)


@built_once
def _register_statement(clock: Clock, postgresql: bool, state: State) -> Executable:
    """INSERT … ON CONFLICT DO NOTHING of a new operation (every column a `new_<column>`
    parameter) returning the audit columns, and on PostgreSQL its `admitted` event in
    the same statement (the event is inserted only for a row that was): built once."""
    dialect_insert = postgresql_insert if postgresql else sqlite_insert
    inserted = (
        dialect_insert(operations)
        .values(**{
            column: bindparam(f"new_{column}", type_=operations.c[column].type)
            for column in _REGISTERED_COLUMNS
        })
        .on_conflict_do_nothing(index_elements=["operation_id"])
        .returning(*AUDIT_COLUMNS)
    )
    if not postgresql:
        return inserted
    cte = inserted.cte("registered")
    return select(cte).add_cte(event_from(cte, None, state, clock).cte("logged"))


@built_once
def register_many_statement(clock: Clock, state: State) -> Executable:
    """`_register_statement` for many new operations of one starting state in one
    statement (PostgreSQL): each column's values as an array (`new_<column>`),
    unnested in step, `ON CONFLICT DO NOTHING`, returning the rows it inserted, each
    with its `admitted` event in the same statement. The caller compares the ids
    returned with the ids it sent: one missing was registered by someone else."""
    rows = select(*(
        func.unnest(bindparam(f"new_{column}", type_=ARRAY(operations.c[column].type))).label(column)
        for column in _REGISTERED_COLUMNS
    ))
    inserted = (
        postgresql_insert(operations)
        .from_select(list(_REGISTERED_COLUMNS), rows)
        .on_conflict_do_nothing(index_elements=["operation_id"])
        .returning(*AUDIT_COLUMNS)
    )
    cte = inserted.cte("registered")
    return select(cte).add_cte(event_from(cte, None, state, clock).cte("logged"))


def registration_parameters(new: NewOperation, now: float, postgresql: bool) -> tuple[State, dict[str, Any]]:
    """The state a new operation starts in and `_register_statement`'s parameters for
    it, its timestamps `now` (the database clock, read by the caller)."""
    state = State.PENDING_APPROVAL if new.needs_approval else State.QUEUED
    values = {
        "operation_id": new.operation_id,
        "tenant": new.tenant,
        "request_id": new.request_id,
        "conversation_id": new.conversation_id,
        "call_id": new.call_id,
        "position": new.position,
        "tool_name": new.tool_name,
        "schema_version": new.schema_version,
        "mode": Mode(new.mode).value,
        "state": state.value,
        "generation": 0,
        "intent_hash": new.intent_hash,
        "arguments": dumps(new.arguments),
        "context": dumps(new.context),
        "attempts": 0,
        "available_at": now,
        "queued_at": now if state is State.QUEUED else None,
        "impact": dumps(new.impact) if new.impact is not None else None,
        "approved_resources": (
            dumps(sorted(new.approved_resources))
            if new.approved_resources is not None else None
        ),
        "created_at": now,
        "updated_at": now,
        "trace_context": new.trace_context,
    }
    params = {f"new_{column}": value for column, value in values.items()}
    if postgresql:
        params |= event_params("admitted")
    return state, params


def approval_values(new: NewOperation, now: float) -> dict[str, Any]:
    """The pending approval row of an operation registered `pending_approval`."""
    return {
        "approval_id": "apr_" + secrets.token_hex(12),
        "operation_id": new.operation_id,
        "intent_hash": new.intent_hash,
        "impact": dumps(new.impact),
        "state": ApprovalState.PENDING.value,
        "requested_at": now,
        "expires_at": now + new.approval_ttl_seconds,
    }


def register_statement(clock: Clock, postgresql: bool, state: State) -> Executable:
    """The registering INSERT (see `_register_statement`), built once per clock and state."""
    return _register_statement(clock, postgresql, state)


def register(conn: Connection, new: NewOperation, clock: Clock = DATABASE_CLOCK) -> RegisterOutcome:
    """Create the operation, or report what the idempotency table says about its id."""
    now = conn.execute(select(clock.now())).scalar_one()
    postgresql = conn.dialect.name == "postgresql"
    decision = "admitted"
    state, params = registration_parameters(new, now, postgresql)
    # RETURNING rather than rowcount: drivers disagree on rowcount for DO NOTHING.
    row = conn.execute(_register_statement(clock, postgresql, state), params).one_or_none()
    if row is not None:
        if not postgresql:
            append_event(conn, row, None, state, decision, clock)
        approval_id = None
        if state is State.PENDING_APPROVAL:
            approval = approval_values(new, now)
            approval_id = approval["approval_id"]
            conn.execute(insert(approvals).values(**approval))
        return Created(new.operation_id, state, approval_id)
    existing = conn.execute(
        select(operations.c.state, operations.c.intent_hash).where(
            operations.c.operation_id == new.operation_id
        )
    ).one()
    if existing.intent_hash != new.intent_hash:
        return Conflict(new.operation_id)
    existing_state = State(existing.state)
    if existing_state in TERMINAL:
        return Reused(new.operation_id, existing_state)
    return InProgress(new.operation_id, existing_state)
