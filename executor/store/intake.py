"""Rows an admission writes besides the operation: the call row and the outbox row,
and the lock that serialises producers of one request or conversation."""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    Insert,
    Row,
    bindparam,
    insert,
    select,
    text,
)

from executor.core.admission import Gate
from executor.core.identifiers import storable_key, storable_text
from executor.store.audit import dumps
from executor.store.clock import DATABASE_CLOCK, Clock, built_once
from executor.store.driver import Executes
from executor.store.schema import calls, hosted_calls, outbox


def add_outbox_row(
    conn: Executes, operation_id: str, clock: Clock = DATABASE_CLOCK, delay_seconds: float = 0.0
) -> None:
    """Ask the relay to publish the operation id (in the caller's transaction)."""
    conn.execute(
        _insert_outbox_row(clock, bool(delay_seconds)),
        {"operation_id": operation_id, "delay_seconds": delay_seconds},
    )


@built_once
def _insert_outbox_row(clock: Clock, delayed: bool) -> Insert:
    now = clock.now()
    return insert(outbox).values(
        operation_id=bindparam("operation_id"),
        created_at=now,
        next_attempt_at=now + bindparam("delay_seconds", type_=Float()) if delayed else now,
        attempts=0,
    )


def lock_scopes(conn: Connection, tenant: str, request_id: str, conversation_id: str | None) -> None:
    """Serialise producers of one request and one conversation until this transaction ends.

    Budgets and repeated writes are counted from the rows a scope already holds;
    two producers on READ COMMITTED could both count N-1 and both admit the Nth.
    A transaction-scoped advisory lock per scope makes the second wait for the
    first to commit. Always conversation first, then request, so two producers
    never wait on each other in opposite orders. SQLite needs none: `BEGIN
    IMMEDIATE` already holds the database's one write lock.
    """
    if conn.dialect.name != "postgresql":
        return
    for lock_id in scope_lock_ids(tenant, request_id, conversation_id):
        conn.execute(text("SELECT pg_advisory_xact_lock(:lock_id)"), {"lock_id": lock_id})


def scope_lock_ids(tenant: str, request_id: str, conversation_id: str | None) -> list[int]:
    """The advisory lock ids of a request's scopes, conversation first (`lock_scopes`)."""
    keys = [f"conversation\0{tenant}\0{conversation_id}"] if conversation_id is not None else []
    keys.append(f"request\0{tenant}\0{request_id}")
    return [int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True) for key in keys]


def record_call(
    conn: Connection,
    *,
    tenant: str,
    request_id: str,
    call_id: str,
    position: int,
    tool_name: str,
    operation_id: str | None,
    gate: Gate | None,
    result: dict[str, Any] | None,
    conversation_id: str | None = None,
    proposal_hash: str | None = None,
    reused_from_call_id: str | None = None,
    clock: Clock = DATABASE_CLOCK,
) -> None:
    """One row per proposed call: I6 counts results by these rows. `gate` is where a
    call was decided without running (None for one that was registered to run);
    a repeated write answered from an earlier call names it in `reused_from_call_id`
    and points at its operation."""
    conn.execute(
        _insert_call(clock),
        call_row_parameters(
            tenant=tenant, request_id=request_id, call_id=call_id, position=position,
            tool_name=tool_name, operation_id=operation_id, gate=gate, result=result,
            conversation_id=conversation_id, proposal_hash=proposal_hash,
            reused_from_call_id=reused_from_call_id,
        ),
    )


def call_row_parameters(
    *, gate: Gate | None, result: dict[str, Any] | None, **columns: Any
) -> dict[str, Any]:
    """`_insert_call`'s parameters for one call row, from `record_call`'s arguments: the
    gate by its value, the result as JSON, absent optional columns as NULL."""
    unknown = columns.keys() - set(_CALL_COLUMNS)
    if unknown:
        raise TypeError(f"not a column of a call row: {', '.join(sorted(unknown))}")
    values = {column: columns.get(column) for column in _CALL_COLUMNS}
    values["gate"] = None if gate is None else gate.value
    values["result"] = dumps(result) if result is not None else None
    return values


_CALL_COLUMNS = (
    "tenant", "request_id", "conversation_id", "proposal_hash", "reused_from_call_id", "call_id",
    "position", "tool_name", "operation_id", "gate", "result",
)


@built_once
def _insert_call(clock: Clock) -> Insert:
    return insert(calls).values(
        **{column: bindparam(column, type_=calls.c[column].type) for column in _CALL_COLUMNS},
        created_at=clock.now(),
    )


_clip = storable_text


def record_hosted_call(
    conn: Connection,
    *,
    tenant: str,
    request_id: str,
    hosted_call_id: str,
    surface: str,
    kind: str,
    server_label: str | None,
    tool_name: str | None,
    item_id: str | None,
    status: str | None,
    output_digest: str | None,
    allowed: bool | None,
    code: str | None,
    call_id: str | None,
    clock: Clock = DATABASE_CLOCK,
) -> None:
    """One append-only row per provider-run call read from a response, on the database
    clock. `allowed` is None for an item that only reports a run (the call it answers
    is the one checked); `call_id` names the call row answering a call the policy did
    not allow. Arguments and output text are never stored, only the output's digest.

    Every column is bounded and every text here may be provider-written: the keys
    (`hosted_call_id`, `call_id`) and the digest are stored as they are when they
    are identifiers of their column's size, else under a digest of themselves
    (`storable_key`); the descriptive texts are clipped to their column with NUL and
    lone surrogates replaced (`storable_text`). Nothing a provider writes can make
    this insert fail and roll back the producer's transaction."""
    conn.execute(
        insert(hosted_calls).values(
            tenant=tenant,
            request_id=request_id,
            hosted_call_id=storable_key(hosted_call_id),
            surface=_clip(surface, 32),
            kind=_clip(kind, 64),
            server_label=_clip(server_label, 200),
            tool_name=_clip(tool_name, 200),
            item_id=_clip(item_id, 200),
            status=_clip(status, 32),
            output_digest=None if output_digest is None else storable_key(output_digest, 64),
            allowed=allowed,
            code=_clip(code, 64),
            call_id=None if call_id is None else storable_key(call_id),
            recorded_at=clock.now(),
        )
    )


def hosted_calls_of_request(conn: Connection, tenant: str, request_id: str) -> dict[str, Row[Any]]:
    """hosted_call_id → the hosted-call row already recorded for this request."""
    rows = conn.execute(
        select(hosted_calls).where(hosted_calls.c.tenant == tenant, hosted_calls.c.request_id == request_id)
    ).all()
    return {row.hosted_call_id: row for row in rows}
