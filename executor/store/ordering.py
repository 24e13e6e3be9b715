"""Proposal order: which operations of a request must still wait for an earlier one.

A request is (tenant, request id): two tenants' requests of one id never wait on
each other.

One predicate, `runnable_queued` ("queued and not waiting on an earlier call, so a
worker should take it"), is what the reconciler's republishing (`stale_queued`),
the wake-up of successors (`release_successors`) and the exporter's stuck gauge
(I2) count as runnable, so "runnable" means the same thing everywhere. The
reservation CAS uses the same `waiting_on_earlier`, stricter for write after
write (see `reserve`).

State and mode names are written into this SQL as literals, not bound
parameters: the exporter's queries use the predicate too, and a partial index
(`WHERE state = 'queued'`) is usable only when the planner can prove the query's
predicate implies the index's, which a generic plan over `$1` (psycopg prepares
a statement after a few executions) cannot. The literals are enum values, never
input.
"""

from __future__ import annotations

import functools
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    FromClause,
    Select,
    and_,
    bindparam,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
)

from executor.core.states import SETTLED, TERMINAL, State
from executor.core.tools import Mode
from executor.store.clock import Clock
from executor.store.driver import Executes
from executor.store.intake import add_outbox_row
from executor.store.schema import operations


def sql_literal(value: StrEnum) -> ColumnElement[str]:
    """An enum's value as a SQL string literal (see the module docstring for why)."""
    return literal_column(f"'{value.value}'")


def keyed_state_is(column: ColumnElement[str], state: State) -> ColumnElement[bool]:
    """`column = 'state'` for a statement that finds its rows by primary key (a CAS
    on one operation, a renewal of the operations a worker holds).

    Written `column || '' = 'state'`: no index has that expression, so the planner
    cannot prove the clause implies a partial index's `WHERE state = …` and looks
    the row up by its key. With the plain comparison it may walk the partial index
    instead: the index's statistics say it is nearly empty (reltuples 0 between
    vacuums) while every operation that passed through the state left an entry in
    it, so each CAS read all of them (a reservation with 5,000 operations queued in
    a busy table: 157 buffers and 1.1 ms, against 4 buffers and 0.04 ms by key).
    Same truth value: `state` is NOT NULL. Set queries (the reconciler's sweeps,
    the relay's due retries, `runnable_queued`) keep the plain literal, which is
    what lets them use those indexes."""
    return column.concat(literal_column("''")) == sql_literal(state)


def _literals(states: frozenset[State]) -> list[ColumnElement[str]]:
    return [sql_literal(s) for s in sorted(states)]


def _is_write(table: FromClause) -> ColumnElement[bool]:
    return table.c.mode == sql_literal(Mode.WRITE)


# The predicates below are built once per (table or alias, states) and reused: a
# SQLAlchemy construct is immutable, and building these (an alias and its column
# collection, a correlated EXISTS) on every reserve and completion was a fifth of
# the worker's CPU per operation.
@functools.cache
def waiting_on_earlier(
    outer: FromClause, *, write_after_write: frozenset[State] = TERMINAL
) -> ColumnElement[bool]:
    """SQL: the operation must still wait for an earlier call of its request.

    Proposal order, as docs/design.md §Ordering states it: reads of a request run in parallel with
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
            earlier.c.tenant == outer.c.tenant,
            earlier.c.request_id == outer.c.request_id,
            earlier.c.position < outer.c.position,
            or_(_is_write(earlier), _is_write(outer)),
            or_(
                earlier.c.state.not_in(_literals(SETTLED)),
                and_(
                    _is_write(earlier),
                    _is_write(outer),
                    earlier.c.state.not_in(_literals(write_after_write)),
                ),
            ),
        )
    )


@functools.cache
def runnable_queued(outer: FromClause) -> ColumnElement[bool]:
    """SQL: `queued` and not waiting on an earlier call, so a worker should take it.

    Every earlier call it depends on is settled. A worker that takes it runs it, or,
    for a write behind a write that did not succeed (`reconciliation_pending`
    included), ends it `predecessor_failed`; either way it must not sit in the
    queue. Due time (`available_at`) is the caller's to add.
    """
    return and_(
        outer.c.state == sql_literal(State.QUEUED),
        ~waiting_on_earlier(outer, write_after_write=SETTLED),
    )


def predecessor_failed(conn: Connection, operation_id: str) -> bool:
    """For a write: did an earlier write of its request end other than `succeeded`?

    `reconciliation_pending` counts: the earlier write did not succeed, and waiting
    for a person would leave this one queued forever (I2). It ends
    `predecessor_failed` and the model decides what next, as for a failure.
    """
    op = conn.execute(
        select(
            operations.c.tenant, operations.c.request_id, operations.c.position, operations.c.mode
        ).where(
            operations.c.operation_id == operation_id
        )
    ).one_or_none()
    if op is None or op.mode != Mode.WRITE:
        return False
    failed = conn.execute(
        select(func.count())
        .select_from(operations)
        .where(
            operations.c.tenant == op.tenant,
            operations.c.request_id == op.request_id,
            operations.c.position < op.position,
            operations.c.mode == Mode.WRITE.value,
            operations.c.state.in_(
                [State.FAILED_TERMINAL.value, State.RECONCILIATION_PENDING.value]
            ),
        )
    ).scalar_one()
    return bool(failed)


def release_successors(
    conn: Executes, tenant: str, request_id: str, position: int, clock: Clock
) -> None:
    """An operation settled: wake the queued successors of its request that are now runnable.

    They had no message while they waited (see `waiting_on_earlier`); a fresh one
    lets a worker run them now, or end a write `predecessor_failed`. The settled
    operation is named by its request and position (the transition returns them).
    """
    successors = conn.execute(
        _successors_statement(), {"tenant": tenant, "request_id": request_id, "position": position}
    ).scalars()
    for successor in successors:
        add_outbox_row(conn, successor, clock)


@functools.cache
def _successors_statement() -> Select[Any]:
    """The runnable queued operations after `:position` in the request (`:tenant`,
    `:request_id`), built once.

    By value, not joined to the settled row: with the join, PostgreSQL may plan it
    from the partial index of queued operations and scan every queued operation
    of every request on each completion (O(backlog) per operation); equality on
    the request keeps it on the request's index."""
    return select(operations.c.operation_id).where(
        operations.c.tenant == bindparam("tenant"),
        operations.c.request_id == bindparam("request_id"),
        operations.c.position > bindparam("position"),
        runnable_queued(operations),
    )
