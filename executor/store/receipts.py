"""Receipts: every downstream id a worker or the reconciler sees, stale owners' included (I1)."""

from __future__ import annotations

from sqlalchemy import (
    Insert,
    bindparam,
    func,
    insert,
    select,
)

from executor.store.clock import DATABASE_CLOCK, Clock, built_once
from executor.store.driver import Executes
from executor.store.schema import receipts


@built_once
def _insert_receipt(clock: Clock) -> Insert:
    return insert(receipts).values(
        operation_id=bindparam("operation_id"),
        generation=bindparam("generation"),
        receipt=bindparam("receipt"),
        accepted=bindparam("accepted"),
        source=bindparam("source"),
        recorded_at=clock.now(),
    )


def record_receipt(
    conn: Executes,
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
        _insert_receipt(clock),
        {
            "operation_id": operation_id, "generation": generation, "receipt": receipt,
            "accepted": accepted, "source": source,
        },
    )


_DISTINCT_ACCEPTED = select(func.count(func.distinct(receipts.c.receipt))).where(
    receipts.c.operation_id == bindparam("operation_id"), receipts.c.accepted.is_(True)
)


def distinct_accepted_receipts(conn: Executes, operation_id: str) -> int:
    return int(conn.execute(_DISTINCT_ACCEPTED, {"operation_id": operation_id}).scalar_one())
