"""Reads of operations for the worker, the CLI and results (no state changes)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import (
    Connection,
    select,
)

from executor.core.states import State
from executor.store.clock import DATABASE_CLOCK, Clock
from executor.store.records import OperationRow
from executor.store.schema import operations


def get_operation(conn: Connection, operation_id: str) -> OperationRow | None:
    row = conn.execute(
        select(operations).where(operations.c.operation_id == operation_id)
    ).one_or_none()
    return None if row is None else OperationRow.from_row(row)


def operations_in(conn: Connection, operation_ids: Iterable[str]) -> dict[str, OperationRow]:
    ids = list(operation_ids)
    if not ids:
        return {}
    return {
        r.operation_id: OperationRow.from_row(r)
        for r in conn.execute(select(operations).where(operations.c.operation_id.in_(ids)))
    }


def lease_remaining(conn: Connection, operation_id: str, clock: Clock = DATABASE_CLOCK) -> float | None:
    """Seconds until a `started` operation's lease expires, on the database clock."""
    return conn.execute(
        select(operations.c.lease_expires_at - clock.now()).where(
            operations.c.operation_id == operation_id,
            operations.c.state == State.STARTED.value,
        )
    ).scalar_one_or_none()
