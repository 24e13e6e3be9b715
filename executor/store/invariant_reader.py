"""Reads a live database's records for the invariants I1–I7, a window at a time, in chunks.

`toolfence check` and the exporter judge a live database with the pure functions
of `executor.core.invariants`; this module is how the records get to them,
read-only and in bounded memory (decision 0210,
docs/decisions/0210-toolfence-check-judges-the-operations-touched-in-a-window-a-chunk-at-a-time.md):

- The **window** (`since`, epoch seconds on the database clock, or None for the
  whole tables) selects the operations *touched* at or after `since`: an audit
  event, an accepted receipt, a call row, or a downstream effect or refusal
  written then. Each selected operation is judged on all its records, however
  old, so a late event of an old operation (a stale completion, an illegal
  transition) is seen within the window after it happens. Calls are selected by
  when their row was written. Active operations updated in the window are selected
  too (their partial index), so a row written with no audit event or call is seen.
- The audit table has no index on its time: it is append-only and `at` is read
  from the database clock in the INSERT that takes the next event id, so event
  ids grow with time, and the first event of the window is found by bisecting the
  primary key (`first_event_of_window`), a minute early for clocks of concurrent
  sessions; receipts and calls have time indexes (migration 0002).
- The selected ids come from one query the database streams (a server-side cursor
  on PostgreSQL); each chunk of ids is then read by primary key or index, so
  memory follows the chunk size, not the table.
- Stuck operations (I2) are read through the active part's partial indexes: a
  present condition, the same whatever the window.

Nothing here writes or locks: the caller runs it in a read-only transaction
(`executor.store.engine.read_only`, or the exporter's read-only REPEATABLE READ).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    CompoundSelect,
    Connection,
    Select,
    String,
    any_,
    cast,
    func,
    literal,
    literal_column,
    select,
    true,
    union,
    union_all,
)

from executor.core import invariants
from executor.core.states import ApprovalState, State
from executor.store.ordering import runnable_queued, sql_literal
from executor.store.schema import ACTIVE_STATES, approvals, audit_events, calls, operations, receipts

CHUNK = 500
"""Operation ids (or calls) judged together: bounds memory and each IN list (SQLite's
default limit on bound parameters is far above it)."""

CLOCK_SKEW_SECONDS = 60.0
"""How much earlier than `since` the audit window starts: events of concurrent
sessions take ids and clock readings in slightly different orders."""


class Downstream(Protocol):
    """A downstream's own records of the writes it accepted and refused (I1, I3, I4, I7).

    toolfence's tables say what toolfence saw; a downstream that keeps its own
    (the reference ledger's `ledger_effects` and `ledger_fenced`) lets the check
    count effects toolfence never heard of. `name` is shown in the report.
    """

    name: str

    def touched(self, since: float | None) -> Select[tuple[str]]:
        """Operation ids with an effect or refusal at or after `since` (all when None)."""
        ...

    def effects(self, conn: Connection, operation_ids: Sequence[str]) -> list[invariants.EffectRecord]: ...

    def refusals(self, conn: Connection, operation_ids: Sequence[str]) -> list[invariants.RefusalRecord]: ...


@dataclass(frozen=True)
class OperationChunk:
    """Every record of a chunk of operations, as the invariants take them."""

    operation_ids: list[str]
    records: invariants.Records


@dataclass(frozen=True)
class CallRow:
    """A call row with what answers it: its stored result, else its operation."""

    tenant: str
    request_id: str
    call_id: str
    tool_name: str
    operation_id: str | None
    reused: bool
    answered_at_admission: bool
    operation_tool: str | None
    operation_state: str | None
    created_at: float


# ------------------------------------------------------------------ the window


def _first_event_at_or_after(conn: Connection, event_id: int) -> tuple[int, float] | None:
    row = conn.execute(
        select(audit_events.c.event_id, audit_events.c.at)
        .where(audit_events.c.event_id >= event_id)
        .order_by(audit_events.c.event_id)
        .limit(1)
    ).first()
    return None if row is None else (int(row.event_id), float(row.at))


def first_event_of_window(conn: Connection, since: float) -> int | None:
    """The lowest event id from which the audit trail is at or after `since` (less
    the clock skew), by bisecting the primary key; None when no event is that recent."""
    lowest, highest = conn.execute(
        select(func.min(audit_events.c.event_id), func.max(audit_events.c.event_id))
    ).one()
    if highest is None:
        return None
    start = since - CLOCK_SKEW_SECONDS
    low, high = int(lowest), int(highest)
    last = _first_event_at_or_after(conn, high)
    if last is None or last[1] < start:
        return None
    while low < high:
        middle = (low + high) // 2
        found = _first_event_at_or_after(conn, middle)
        if found is not None and found[1] >= start:
            high = middle
        else:
            low = middle + 1
    return low


def _touched_operations(
    conn: Connection, since: float | None, downstream: Downstream | None
) -> CompoundSelect[Any]:
    """One query for the ids of the operations the window selects (distinct)."""
    named_by_call = calls.c.operation_id.is_not(None)
    parts: list[Select[Any]]
    if since is None:
        parts = [
            select(operations.c.operation_id),
            select(audit_events.c.operation_id),
            select(receipts.c.operation_id),
            select(calls.c.operation_id).where(named_by_call),
        ]
    else:
        parts = [
            # The accepted-receipt index's own predicate (SQLite matches it by text).
            select(receipts.c.operation_id).where(
                receipts.c.accepted == true(), receipts.c.recorded_at >= since
            ),
            select(calls.c.operation_id).where(calls.c.created_at >= since, named_by_call),
            # Active operations changed in the window (the active partial index): one
            # written with neither an audit event nor a call row is still seen.
            select(operations.c.operation_id).where(
                operations.c.state.in_([literal_column(f"'{s}'") for s in ACTIVE_STATES]),
                operations.c.updated_at >= since,
            ),
        ]
        first_event = first_event_of_window(conn, since)
        if first_event is not None:
            parts.append(
                select(audit_events.c.operation_id).where(audit_events.c.event_id >= first_event)
            )
    if downstream is not None:
        parts.append(downstream.touched(since))
    return union(*parts)


def _chunks(conn: Connection, query: Any, size: int) -> Iterator[list[Any]]:
    """The query's rows, `size` at a time, streamed (a server-side cursor on PostgreSQL)."""
    # On the statement, not the connection: the chunks' own reads stay plain cursors.
    result = conn.execute(query.execution_options(stream_results=True, yield_per=size))
    try:
        for partition in result.partitions(size):
            yield list(partition)
    finally:
        result.close()


# ------------------------------------------------------------------ operations


def among(conn: Connection, column: ColumnElement[str], ids: Sequence[str]) -> ColumnElement[bool]:
    """`column` is one of `ids`: one array parameter on PostgreSQL (`= ANY`, the same
    statement text for every chunk, so the driver's and server's caches hold it), an
    IN list on SQLite."""
    if conn.dialect.name == "postgresql":
        return column == any_(cast(literal(list(ids), ARRAY(String)), ARRAY(String)))
    return column.in_(ids)



def _operation_records(conn: Connection, ids: Sequence[str]) -> list[invariants.OperationRecord]:
    return [
        invariants.OperationRecord(
            r.operation_id, r.request_id, r.call_id, r.tool_name, r.mode, r.state, int(r.generation)
        )
        for r in conn.execute(
            select(
                operations.c.operation_id, operations.c.request_id, operations.c.call_id,
                operations.c.tool_name, operations.c.mode, operations.c.state, operations.c.generation,
            ).where(among(conn, operations.c.operation_id, ids))
        )
    ]


def _audit_records(conn: Connection, ids: Sequence[str]) -> list[invariants.AuditRecord]:
    return [
        invariants.AuditRecord(
            int(e.event_id), e.operation_id, e.from_state, e.to_state, int(e.generation), float(e.at)
        )
        for e in conn.execute(
            select(
                audit_events.c.event_id, audit_events.c.operation_id, audit_events.c.from_state,
                audit_events.c.to_state, audit_events.c.generation, audit_events.c.at,
            )
            .where(among(conn, audit_events.c.operation_id, ids))
            .order_by(audit_events.c.event_id)
        )
    ]


def _receipt_records(conn: Connection, ids: Sequence[str]) -> list[invariants.ReceiptRecord]:
    return [
        invariants.ReceiptRecord(
            r.operation_id, int(r.generation), r.receipt, bool(r.accepted), float(r.recorded_at)
        )
        for r in conn.execute(
            select(
                receipts.c.operation_id, receipts.c.generation, receipts.c.receipt,
                receipts.c.accepted, receipts.c.recorded_at,
            ).where(among(conn, receipts.c.operation_id, ids))
        )
    ]


def _call_records(conn: Connection, ids: Sequence[str]) -> list[invariants.CallRecord]:
    # A repeat answered from an earlier call points at that call's operation; the
    # operation was admitted by the earlier call, so the repeat is no admission.
    return [
        invariants.CallRecord(
            c.request_id, c.call_id, None if c.reused_from_call_id is not None else c.operation_id
        )
        for c in conn.execute(
            select(
                calls.c.request_id, calls.c.call_id, calls.c.operation_id, calls.c.reused_from_call_id
            ).where(among(conn, calls.c.operation_id, ids))
        )
    ]


def operation_chunks(
    conn: Connection, since: float | None, downstream: Downstream | None, size: int = CHUNK
) -> Iterator[OperationChunk]:
    """The window's operations, `size` at a time, each with all its records."""
    for rows in _chunks(conn, _touched_operations(conn, since, downstream), size):
        ids = [row[0] for row in rows]
        yield OperationChunk(ids, traces(conn, ids, downstream, calls_too=True))


def latest_touches(conn: Connection, ids: Sequence[str]) -> dict[str, float]:
    """When each of these operations was last touched, by the window's own measure: its
    latest audit event, accepted receipt or call row, or its update while active.

    The exporter keeps a violation until the window passes this moment, as
    `toolfence check --since` would count it. Read for the few operations found
    violating, not for every one judged.
    """
    if not ids:
        return {}
    active = operations.c.state.in_([literal_column(f"'{s}'") for s in ACTIVE_STATES])
    touches = union_all(
        select(audit_events.c.operation_id.label("operation_id"), audit_events.c.at.label("at"))
        .where(among(conn, audit_events.c.operation_id, ids)),
        select(receipts.c.operation_id, receipts.c.recorded_at)
        .where(receipts.c.accepted == true(), among(conn, receipts.c.operation_id, ids)),
        select(calls.c.operation_id, calls.c.created_at).where(among(conn, calls.c.operation_id, ids)),
        select(operations.c.operation_id, operations.c.updated_at)
        .where(active, among(conn, operations.c.operation_id, ids)),
    ).subquery()
    return {
        str(operation_id): float(at)
        for operation_id, at in conn.execute(
            select(touches.c.operation_id, func.max(touches.c.at)).group_by(touches.c.operation_id)
        )
    }


def traces(
    conn: Connection, ids: Sequence[str], downstream: Downstream | None, *, calls_too: bool = False
) -> invariants.Records:
    """Every record naming these operation ids (for I7: the ids rejected calls would have had)."""
    return invariants.Records(
        operations=_operation_records(conn, ids),
        audit=_audit_records(conn, ids),
        receipts=_receipt_records(conn, ids),
        calls=_call_records(conn, ids) if calls_too else [],
        effects=downstream.effects(conn, ids) if downstream is not None else [],
        refusals=downstream.refusals(conn, ids) if downstream is not None else [],
    )


# ------------------------------------------------------------------ calls


def call_chunks(conn: Connection, since: float | None, size: int = CHUNK) -> Iterator[list[CallRow]]:
    """The calls written at or after `since` (all when None), with what answers each."""
    op = operations.alias("op")
    query = select(
        calls.c.tenant, calls.c.request_id, calls.c.call_id, calls.c.tool_name, calls.c.operation_id,
        calls.c.reused_from_call_id, calls.c.result.is_not(None).label("answered"),
        op.c.tool_name.label("operation_tool"), op.c.state.label("operation_state"),
        calls.c.created_at,
    ).select_from(calls.outerjoin(op, op.c.operation_id == calls.c.operation_id))
    if since is not None:
        query = query.where(calls.c.created_at >= since)
    for rows in _chunks(conn, query, size):
        yield [
            CallRow(
                r.tenant, r.request_id, r.call_id, r.tool_name, r.operation_id,
                r.reused_from_call_id is not None, bool(r.answered), r.operation_tool,
                r.operation_state, float(r.created_at),
            )
            for r in rows
        ]


# ------------------------------------------------------------------ stuck (I2)


def _state_is(state: State) -> ColumnElement[bool]:
    # A literal, not a bound parameter: the planner then proves the partial index's WHERE.
    return operations.c.state == literal_column(f"'{state.value}'")


def stuck_queries(cutoff: float) -> dict[str, Select[Any]]:
    """Per state, the operations overdue since before `cutoff` (I2 on a live system).

    - started: lease expired before the cutoff and the reconciler has not acted;
    - queued: due before the cutoff and runnable (`runnable_queued`: not waiting on
      an earlier call, so a worker should have taken it), yet not reserved;
    - retry_wait: backoff over before the cutoff and not promoted;
    - pending_approval: its approval expired before the cutoff, not yet expired
      by the reconciler.

    Each reads the small active part of the table through a partial index. The
    exporter counts them (`toolfence_operations_stuck`); the check lists them.
    """
    columns = (
        operations.c.operation_id, operations.c.request_id, operations.c.call_id,
        operations.c.tool_name, operations.c.mode, operations.c.state, operations.c.generation,
    )
    return {
        State.PENDING_APPROVAL.value: select(*columns)
        .select_from(approvals.join(operations, operations.c.operation_id == approvals.c.operation_id))
        .where(approvals.c.state == sql_literal(ApprovalState.PENDING), approvals.c.expires_at < cutoff),
        State.QUEUED.value: select(*columns).where(
            runnable_queued(operations), operations.c.available_at < cutoff
        ),
        State.STARTED.value: select(*columns).where(
            _state_is(State.STARTED), operations.c.lease_expires_at < cutoff
        ),
        State.RETRY_WAIT.value: select(*columns).where(
            _state_is(State.RETRY_WAIT), operations.c.available_at < cutoff
        ),
    }


def stuck_chunks(
    conn: Connection, cutoff: float, size: int = CHUNK
) -> Iterator[list[invariants.OperationRecord]]:
    """The stuck operations of every state, `size` at a time."""
    for query in stuck_queries(cutoff).values():
        for rows in _chunks(conn, query, size):
            yield [
                invariants.OperationRecord(
                    r.operation_id, r.request_id, r.call_id, r.tool_name, r.mode, r.state,
                    int(r.generation),
                )
                for r in rows
            ]
