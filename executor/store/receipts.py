"""Receipts: every downstream id a worker or the reconciler sees, stale owners' included (I1)."""

from __future__ import annotations

from sqlalchemy import (
    Connection,
    func,
    insert,
    select,
)

from executor.store.clock import DATABASE_CLOCK, Clock
from executor.store.schema import receipts


def record_receipt(
    conn: Connection,
    operation_id: str,
    generation: int,
    receipt: str,
    *,
    accepted: bool,
    source: str,
    clock: Clock = DATABASE_CLOCK,
) -> None:
    """Every receipt a worker or the reconciler sees, stale owners' included (I1)."""
    conn.execute(
        insert(receipts).values(
            operation_id=operation_id,
            generation=generation,
            receipt=receipt,
            accepted=accepted,
            source=source,
            recorded_at=clock.now(),
        )
    )


def distinct_accepted_receipts(conn: Connection, operation_id: str) -> int:
    return int(
        conn.execute(
            select(func.count(func.distinct(receipts.c.receipt))).where(
                receipts.c.operation_id == operation_id, receipts.c.accepted.is_(True)
            )
        ).scalar_one()
    )
