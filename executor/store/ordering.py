"""Proposal order: which operations of a request must still wait for an earlier one.

One predicate (`waiting_on_earlier`) is used by the reservation CAS, the
reconciler's republishing and the exporter's stuck gauge, so "runnable" means
the same thing everywhere.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    exists,
    func,
    literal,
    or_,
    select,
)

from executor.core.states import SETTLED, TERMINAL, State
from executor.store.clock import Clock
from executor.store.intake import add_outbox_row
from executor.store.schema import operations


def waiting_on_earlier(outer: Any, *, write_after_write: frozenset[State] = TERMINAL) -> Any:
    """SQL: the operation must still wait for an earlier call of its request.

    Proposal order, as DESIGN.md states it: reads of a request run in parallel with
    each other; a read waits for every earlier write, and a write waits for every
    earlier call — an earlier read too, so a read placed before a write never sees
    it. An earlier call stops blocking once settled (terminal or
    `reconciliation_pending`), except that for write-after-write the caller says
    which states count (`reserve`: terminal only; the worker ends a write behind a
    `reconciliation_pending` write as `predecessor_failed`).
    """
    earlier = operations.alias("earlier")
    return exists(
        select(literal(1))
        .select_from(earlier)
        .where(
            earlier.c.request_id == outer.c.request_id,
            earlier.c.position < outer.c.position,
            or_(earlier.c.mode == "write", outer.c.mode == "write"),
            or_(
                earlier.c.state.not_in([s.value for s in SETTLED]),
                and_(
                    earlier.c.mode == "write",
                    outer.c.mode == "write",
                    earlier.c.state.not_in([s.value for s in write_after_write]),
                ),
            ),
        )
    )


def predecessor_failed(conn: Connection, operation_id: str) -> bool:
    """For a write: did an earlier write of its request end other than `succeeded`?

    `reconciliation_pending` counts: the earlier write did not succeed, and waiting
    for a person would leave this one queued forever (I2). It ends
    `predecessor_failed` and the model decides what next, as for a failure.
    """
    op = conn.execute(
        select(operations.c.request_id, operations.c.position, operations.c.mode).where(
            operations.c.operation_id == operation_id
        )
    ).one_or_none()
    if op is None or op.mode != "write":
        return False
    failed = conn.execute(
        select(func.count())
        .select_from(operations)
        .where(
            operations.c.request_id == op.request_id,
            operations.c.position < op.position,
            operations.c.mode == "write",
            operations.c.state.in_(
                [State.FAILED_TERMINAL.value, State.RECONCILIATION_PENDING.value]
            ),
        )
    ).scalar_one()
    return bool(failed)


def release_successors(conn: Connection, operation_id: str, clock: Clock) -> None:
    """An operation settled: wake the queued successors of its request that no longer wait.

    They had no message while they waited (see `waiting_on_earlier`); a fresh one
    lets a worker run them now, or end a write `predecessor_failed`.
    """
    settled = operations.alias("settled")
    successors = conn.execute(
        select(operations.c.operation_id)
        .select_from(
            operations.join(
                settled,
                and_(
                    settled.c.operation_id == operation_id,
                    operations.c.request_id == settled.c.request_id,
                    operations.c.position > settled.c.position,
                ),
            )
        )
        .where(
            operations.c.state == State.QUEUED.value,
            ~waiting_on_earlier(operations, write_after_write=SETTLED),
        )
    ).scalars()
    for successor in successors:
        add_outbox_row(conn, successor, clock)
