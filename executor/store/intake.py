"""Rows an admission writes besides the operation: the call row and the outbox row,
and the lock that serialises producers of one request or conversation."""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import (
    Connection,
    insert,
    text,
)

from executor.core.admission import Gate
from executor.store.audit import dumps
from executor.store.clock import DATABASE_CLOCK, Clock
from executor.store.schema import calls, outbox


def add_outbox_row(
    conn: Connection, operation_id: str, clock: Clock = DATABASE_CLOCK, delay_seconds: float = 0.0
) -> None:
    """Ask the relay to publish the operation id (in the caller's transaction)."""
    now = clock.now()
    conn.execute(
        insert(outbox).values(
            operation_id=operation_id,
            created_at=now,
            next_attempt_at=now + delay_seconds if delay_seconds else now,
            attempts=0,
        )
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
    keys = ([f"conversation\0{tenant}\0{conversation_id}"] if conversation_id is not None else [])
    keys.append(f"request\0{tenant}\0{request_id}")
    for key in keys:
        lock_id = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)
        conn.execute(text("SELECT pg_advisory_xact_lock(:lock_id)"), {"lock_id": lock_id})


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
        insert(calls).values(
            tenant=tenant,
            request_id=request_id,
            conversation_id=conversation_id,
            proposal_hash=proposal_hash,
            reused_from_call_id=reused_from_call_id,
            call_id=call_id,
            position=position,
            tool_name=tool_name,
            operation_id=operation_id,
            gate=None if gate is None else gate.value,
            result=dumps(result) if result is not None else None,
            created_at=clock.now(),
        )
    )
