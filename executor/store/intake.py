"""Rows an admission writes besides the operation: the call row and the outbox row."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Connection,
    insert,
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


def record_call(
    conn: Connection,
    *,
    request_id: str,
    call_id: str,
    position: int,
    tool_name: str,
    operation_id: str | None,
    gate: Gate | None,
    result: dict[str, Any] | None,
    clock: Clock = DATABASE_CLOCK,
) -> None:
    """One row per proposed call: I6 counts results by these rows. `gate` is where a
    call was decided without running (None for one that was registered to run)."""
    conn.execute(
        insert(calls).values(
            request_id=request_id,
            call_id=call_id,
            position=position,
            tool_name=tool_name,
            operation_id=operation_id,
            gate=None if gate is None else gate.value,
            result=dumps(result) if result is not None else None,
            created_at=clock.now(),
        )
    )
