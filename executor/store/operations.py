"""The operation store: every state-changing statement on an operation, in one place.

The fencing argument, in one paragraph. An operation is run only by the holder of
its current `(generation, owner_token)`. `reserve` and `take_over` are the only
statements that hand out ownership, and each is one compare-and-set that adds one
to `generation` and writes a fresh owner token and a lease on the database clock,
so two reservers can never both win the same generation. Every later write by an
owner (`renew`, `complete`, `release_to_retry`, `mark_unknown`,
`mark_scope_exceeded`) repeats the CAS on
`(operation_id, state='started', generation, owner_token)`, and `still_owner`
reads the same condition with a live lease just before a downstream write: once
anyone takes over, the old owner's writes match no row and change nothing. The
downstream receives the generation as `fencing_token` and rejects lower ones in
the same transaction as its effect, which closes the window between the old
owner's last successful renew and its next downstream write. `generation` is only
ever incremented. The reconciler's statements (`requeue_stale`,
`mark_unknown_expired`, `record_lookup_result`) CAS on the generation they
observed *and* on an expired lease, so they never race a live owner.

Every transition is one call of `_transition`: an UPDATE whose WHERE names the
operation, the state it leaves and the statement's own fence (owner, expired
lease, due time, proposal order), and which, only if it matched a row, appends
the audit event for exactly that pair of states and gives the new state what it
needs (an outbox row, or a wake-up for waiting successors). Each function runs
inside the caller's transaction (a `Connection`; the worker's reservation and
completion a `driver.DriverConnection`, the same statements on the pooled driver
connection) and returns whether it won.

Around this module: `cas_sql` builds the rest of a CAS's statement around the WHERE
written here (its SET, RETURNING, and on PostgreSQL the event in the same statement);
`registration` creates operations (generation 0, no owner); `reads` holds the
sweeps' reads (`due_retries`, `stale_started`, `stale_queued`), which change nothing.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Connection,
    Executable,
    Float,
    Row,
    and_,
    bindparam,
    literal,
    or_,
    select,
    tuple_,
    update,
)

from executor.core.states import SETTLED, State
from executor.core.tools import Mode
from executor.core.types import ErrorCode
from executor.store.audit import AUDIT_COLUMNS, DECISION_CODE, append_event, dumps, event_params
from executor.store.cas_sql import INCREMENT, NOW, Now, ReceiptToRecord, cas_statement, value_kind
from executor.store.clock import DATABASE_CLOCK, Clock, built_once
from executor.store.driver import Executes
from executor.store.intake import add_outbox_row
from executor.store.ordering import keyed_state_is, release_successors, sql_literal, waiting_on_earlier
from executor.store.receipts import distinct_accepted_receipts, record_receipt
from executor.store.records import Completion, OperationRow, Reservation, StoreError
from executor.store.results import DriverRow
from executor.store.schema import operations


class Fence(NamedTuple):
    """One condition of a CAS's WHERE, besides the operation and the state it leaves:
    a shape (`_FENCES`: its SQL, over bound parameters, built once per clock) and the
    values of those parameters."""

    shape: str
    params: Mapping[str, Any]


_FENCES: Mapping[str, Callable[[Clock], ColumnElement[bool]]] = {
    # The owner's fence: still the generation and owner token it reserved with.
    "owner": lambda clock: and_(
        operations.c.generation == bindparam("fence_generation"),
        operations.c.owner_token == bindparam("fence_owner_token"),
    ),
    # The reconciler's fence: the generation it observed, and that lease expired.
    "expired_lease": lambda clock: and_(
        operations.c.generation == bindparam("fence_generation"),
        operations.c.lease_expires_at < clock.now(),
    ),
    # A take-over's: any generation, lease expired.
    "lease_expired": lambda clock: operations.c.lease_expires_at < clock.now(),
    "intent": lambda clock: operations.c.intent_hash == bindparam("fence_intent_hash"),
    "due": lambda clock: operations.c.available_at <= clock.now(),
    "in_order": lambda clock: ~waiting_on_earlier(operations),
    # Needs no predecessor check before it runs (`reserve_first`): a read, or a
    # request's first call.
    "first_or_read": lambda clock: or_(
        operations.c.mode != sql_literal(Mode.WRITE), operations.c.position == 0
    ),
}


def _owner_holds(generation: int, owner_token: str) -> Fence:
    """The owner's fence: still the generation and owner token it reserved with."""
    return Fence("owner", {"fence_generation": generation, "fence_owner_token": owner_token})


def _lease_expired(generation: int) -> Fence:
    """The reconciler's fence: the generation it observed, and that lease expired. It
    never races a live owner, and loses to anyone who moved first."""
    return Fence("expired_lease", {"fence_generation": generation})


def intent_is(intent_hash: str) -> Fence:
    """Still the intent a decision was made for (an approval)."""
    return Fence("intent", {"fence_intent_hash": intent_hash})


_DUE = Fence("due", {})
_IN_ORDER = Fence("in_order", {})
_ANY_EXPIRED_LEASE = Fence("lease_expired", {})
_FIRST_OR_READ = Fence("first_or_read", {})

_REQUEST_PLACE = ("tenant", "request_id", "position")


@built_once
def _transition_statement(
    clock: Clock,
    postgresql: bool,
    from_state: State,
    to_state: State,
    fences: tuple[str, ...],
    values: tuple[tuple[str, str], ...],
    returning: tuple[str, ...],
    receipt: str | None = None,
) -> Executable:
    """The statement of one CAS shape, over bound parameters: `cas_operation_id`, the
    fences' `fence_*`, the values' `value_<column>` and (PostgreSQL) the event's
    `event_*`. Built once per shape on the database clock: a transition then costs
    one compiled-cache hit and one round trip, not the construction of an UPDATE,
    a CTE and an INSERT … SELECT.

    The WHERE is this, and only this: the operation, the state it leaves, and each
    fence's condition (`_FENCES`). `cas_sql.cas_statement` builds the rest around it
    (the SET, RETURNING, and on PostgreSQL the event, a settling transition's
    `later_queued` and `receipt` in the same statement)."""
    where = (
        operations.c.operation_id == bindparam("cas_operation_id"),
        keyed_state_is(operations.c.state, from_state),
        *(_FENCES[shape](clock) for shape in fences),
    )
    return cas_statement(clock, postgresql, from_state, to_state, where, values, returning, receipt)


def _transition(
    conn: Executes,
    operation_id: str,
    from_state: State,
    to_state: State,
    *fence: Fence,
    values: Mapping[str, Any],
    decision: str,
    clock: Clock,
    actor: str | None = None,
    duration_ms: float | None = None,
    returning: Sequence[str] = (),
    receipt: ReceiptToRecord | None = None,
) -> Row[Any] | DriverRow | None:
    """One CAS: `from_state → to_state` for the operation, only where `fence` holds.

    Every transition is one call of this, so each does the same four things: the
    states go into the WHERE and the SET (the audit event can never name other
    states than the row went through); `updated_at` is set, and leaving `started`
    clears the owner token and the lease (only a `started` operation has an owner);
    the audit event is appended; and the new state gets what it is owed in the same
    transaction: entering `queued` adds an outbox row (a queued operation without a
    message would sit there), settling (terminal or `reconciliation_pending`) wakes
    the queued successors that waited for it.

    `values` are the columns to SET: a plain value, `NOW` / `Now(seconds)` (the
    clock, plus seconds) or `INCREMENT` (the column plus one); `returning` names
    the columns to return besides the audit columns.

    `receipt` is recorded (accepted) whether the CAS wins or not, in the same
    statement on PostgreSQL; with `receipt.counted` the row also has
    `accepted_receipts` (PostgreSQL only: on SQLite the caller counts).

    Returns the updated row (the audit columns and `returning`), or None when the
    CAS lost: then nothing changed and nothing was appended (but `receipt`).
    Store-internal.
    """
    postgresql = conn.dialect.name == "postgresql"
    if to_state in SETTLED:
        returning = (*returning, *_REQUEST_PLACE)  # where its successors are
    kinds = tuple((column, value_kind(value)) for column, value in values.items())
    receipt_shape = None
    if receipt is not None and postgresql:
        receipt_shape = "counted" if receipt.counted else "recorded"
    elif receipt is not None:
        record_receipt(
            conn, operation_id, receipt.generation, receipt.receipt, accepted=True,
            source=receipt.source, clock=clock,
        )
    statement = _transition_statement(
        clock, postgresql, from_state, to_state, tuple(f.shape for f in fence), kinds,
        tuple(dict.fromkeys(returning)), receipt_shape,
    )
    params: dict[str, Any] = {"cas_operation_id": operation_id}
    if receipt_shape is not None:
        assert receipt is not None
        params |= {
            "receipt_generation": receipt.generation, "receipt_value": receipt.receipt,
            "receipt_source": receipt.source,
        }
    for f in fence:
        params |= f.params
    for column, kind in kinds:
        if kind == "now_plus":
            params[f"value_{column}"] = values[column].seconds
        elif kind == "param":
            params[f"value_{column}"] = values[column]
    if postgresql:
        params |= event_params(decision, actor=actor, duration_ms=duration_ms)
    row: Row[Any] | DriverRow | None = conn.execute(statement, params).one_or_none()
    if row is None:
        return None
    if not postgresql:
        assert isinstance(conn, Connection)  # the driver-level path is PostgreSQL's only
        append_event(conn, row, from_state, to_state, decision, clock, actor=actor, duration_ms=duration_ms)
    if to_state is State.QUEUED:
        add_outbox_row(conn, operation_id, clock)
    elif to_state in SETTLED and (not postgresql or row.later_queued):
        release_successors(conn, row.tenant, row.request_id, row.position, clock)
    return row


@built_once
def _live_owner(clock: Clock) -> ColumnElement[bool]:
    """Still `started`, still this owner (`cas_operation_id`, `fence_generation`,
    `fence_owner_token`), and the lease has not expired."""
    return and_(
        operations.c.operation_id == bindparam("cas_operation_id"),
        keyed_state_is(operations.c.state, State.STARTED),
        _FENCES["owner"](clock),
        operations.c.lease_expires_at > clock.now(),
    )


def _live_owner_params(operation_id: str, generation: int, owner_token: str) -> dict[str, Any]:
    return {
        "cas_operation_id": operation_id, "fence_generation": generation,
        "fence_owner_token": owner_token,
    }


@built_once
def _renew_statement(clock: Clock) -> Executable:
    return (
        update(operations)
        .where(_live_owner(clock))
        .values(
            lease_expires_at=clock.now() + bindparam("value_lease_seconds", type_=Float()),
            updated_at=clock.now(),
        )
        .returning(operations.c.lease_expires_at)
    )


@built_once
def _still_owner_statement(clock: Clock) -> Executable:
    return select(literal(1)).where(_live_owner(clock))


def new_owner_token() -> str:
    """Unique per reservation attempt; the pid lets `show` and the chaos tests tell
    which process owns an operation."""
    return f"{os.getpid()}-{secrets.token_hex(12)}"


def reserve(
    conn: Connection,
    operation_id: str,
    owner_token: str,
    lease_seconds: float,
    clock: Clock = DATABASE_CLOCK,
) -> Reservation | None:
    """queued → started: CAS that takes generation+1, an owner token and a lease.

    Wins only when the operation is due (`available_at` passed) and every earlier
    write of its request is terminal — or, for a read, settled: a read after a
    `reconciliation_pending` write runs and sees the state as it is, while a write
    after one never runs (the worker ends it `predecessor_failed`).
    """
    won = _hand_out_ownership(
        conn, operation_id, State.QUEUED, _DUE, _IN_ORDER,
        owner_token=owner_token, lease_seconds=lease_seconds, decision="reserved", clock=clock,
    )
    return None if won is None else won[0]


# Every column of an operation that the audit columns do not already return.
_REST_OF_ROW = tuple(
    c.name for c in operations.c if c.name not in {a.name for a in AUDIT_COLUMNS}
)


def reserve_first(
    conn: Executes,
    operation_id: str,
    owner_token: str,
    lease_seconds: float,
    clock: Clock = DATABASE_CLOCK,
) -> tuple[Reservation, OperationRow] | None:
    """`reserve`, only for an operation that needs no predecessor check before it runs
    (a read, or a write that is its request's first call), returning the reserved
    row as well: a worker's first read and its CAS in one statement.

    The same CAS as `reserve` (due, in proposal order, from `queued`) with one more
    fence, so it wins only where `reserve` would and the worker would not have
    checked `predecessor_failed` first. Anything else (a duplicate delivery, a
    later write, an operation not yet due) loses and changes nothing; the caller
    then reads the row and takes the general path. The row is as the CAS left it
    (`started`, the new generation and owner).
    """
    won = _hand_out_ownership(
        conn, operation_id, State.QUEUED, _DUE, _IN_ORDER, _FIRST_OR_READ,
        owner_token=owner_token, lease_seconds=lease_seconds, decision="reserved", clock=clock,
        returning=_REST_OF_ROW,
    )
    if won is None:
        return None
    reservation, row = won
    return reservation, OperationRow.from_row(row)


def take_over(
    conn: Connection,
    operation_id: str,
    owner_token: str,
    lease_seconds: float,
    clock: Clock = DATABASE_CLOCK,
) -> Reservation | None:
    """started (lease expired) → started with generation+1 and a new owner.

    Only for tools whose effect allows it (reads, `idempotent`, `fenced`): the
    caller checks the tool's declaration before calling this.
    """
    won = _hand_out_ownership(
        conn, operation_id, State.STARTED, _ANY_EXPIRED_LEASE,
        owner_token=owner_token, lease_seconds=lease_seconds, decision="lease_takeover",
        clock=clock,
    )
    return None if won is None else won[0]


def _hand_out_ownership(
    conn: Executes,
    operation_id: str,
    from_state: State,
    *fence: Fence,
    owner_token: str,
    lease_seconds: float,
    decision: str,
    clock: Clock,
    returning: Sequence[str] = (),
) -> tuple[Reservation, Row[Any] | DriverRow] | None:
    """What `reserve`, `reserve_first` and `take_over` write (they differ in what they
    take over from): generation+1, the new owner token and a lease on the database
    clock, in one CAS. Returns the reservation and the row (`returning` names more
    columns for it)."""
    row = _transition(
        conn, operation_id, from_state, State.STARTED,
        *fence,
        values={
            "generation": INCREMENT,
            "owner_token": owner_token,
            "lease_expires_at": Now(lease_seconds),
            "attempts": INCREMENT,
            "started_at": NOW,
        },
        decision=decision,
        clock=clock,
        returning=tuple(dict.fromkeys(("lease_expires_at", "attempts", *returning))),
    )
    if row is None:
        return None
    return Reservation(
        operation_id, row.generation, owner_token, row.lease_expires_at, row.attempts,
        from_state is State.STARTED,
    ), row


def renew(
    conn: Connection,
    operation_id: str,
    generation: int,
    owner_token: str,
    lease_seconds: float,
    clock: Clock = DATABASE_CLOCK,
) -> float | None:
    """Extend a live lease. Returns the new expiry, or None when ownership is lost.

    An already expired lease is not revived: the reconciler may be acting on it.
    Not a transition (the state stays `started`), so no audit event.
    """
    return conn.execute(
        _renew_statement(clock),
        _live_owner_params(operation_id, generation, owner_token)
        | {"value_lease_seconds": lease_seconds},
    ).scalar_one_or_none()


def renew_many(
    conn: Connection,
    held: Sequence[tuple[str, int, str]],
    lease_seconds: float,
    clock: Clock = DATABASE_CLOCK,
) -> set[str]:
    """`renew` for many leases in one statement: the ids whose lease was extended.

    `held` is (operation id, generation, owner token) per lease. Each row is
    renewed under exactly `renew`'s condition (still `started`, that generation
    and owner, lease not yet expired); an id missing from the answer has lost
    its ownership. One statement per worker per tick, not one per operation.
    """
    if not held:
        return set()
    now = clock.now()
    rows = conn.execute(
        update(operations)
        .where(
            tuple_(operations.c.operation_id, operations.c.generation, operations.c.owner_token).in_(
                list(held)
            ),
            keyed_state_is(operations.c.state, State.STARTED),
            operations.c.lease_expires_at > now,
        )
        .values(lease_expires_at=now + lease_seconds, updated_at=now)
        .returning(operations.c.operation_id)
    ).scalars()
    return set(rows)


def still_owner(
    conn: Connection,
    operation_id: str,
    generation: int,
    owner_token: str,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """The check a worker makes just before a downstream write: `renew`'s condition, read."""
    return (
        conn.execute(
            _still_owner_statement(clock), _live_owner_params(operation_id, generation, owner_token)
        ).first()
        is not None
    )


def complete(
    conn: Connection,
    operation_id: str,
    generation: int,
    owner_token: str,
    intent_hash: str,
    *,
    succeeded: bool,
    result: Any = None,
    receipt: str | None = None,
    error_code: ErrorCode | None = None,
    error: dict[str, Any] | None = None,
    duration_ms: float | None = None,
    decision: str | None = None,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """started → succeeded | failed_terminal. A stale owner's completion matches nothing.

    `complete_counted` without a receipt to record or count (its keywords, spelled
    out so that a caller's misspelt one is a type error, not a TypeError at run
    time), and True when the CAS won."""
    return complete_counted(
        conn, operation_id, generation, owner_token, intent_hash,
        succeeded=succeeded, result=result, receipt=receipt, error_code=error_code,
        error=error, duration_ms=duration_ms, decision=decision, clock=clock,
    ).won


def complete_counted(
    conn: Executes,
    operation_id: str,
    generation: int,
    owner_token: str,
    intent_hash: str,
    *,
    succeeded: bool,
    result: Any = None,
    receipt: str | None = None,
    error_code: ErrorCode | None = None,
    error: dict[str, Any] | None = None,
    duration_ms: float | None = None,
    decision: str | None = None,
    record_receipt_from: str | None = None,
    count_receipts: bool = False,
    clock: Clock = DATABASE_CLOCK,
) -> Completion:
    """started → succeeded | failed_terminal, recording `receipt` as well (accepted,
    from `record_receipt_from`, whether the CAS wins or not) and, with
    `count_receipts`, answering the operation's distinct accepted receipts when it
    wins: on PostgreSQL all of it in the completion's one statement. A stale
    owner's completion matches nothing.

    The audit's decision is the error code (or `succeeded`) unless `decision` names
    it more precisely (`business_rule_violation_at_execution`: a re-check refused
    before the handler ran)."""
    code = None if succeeded else (error_code or ErrorCode.EXECUTION_FAILED).value
    fresh = None
    if record_receipt_from is not None and receipt is not None:
        fresh = ReceiptToRecord(generation, receipt, record_receipt_from, counted=count_receipts)
    row = _transition(
        conn, operation_id, State.STARTED, State.SUCCEEDED if succeeded else State.FAILED_TERMINAL,
        _owner_holds(generation, owner_token),
        intent_is(intent_hash),
        values={
            "result": dumps(result) if succeeded else None,
            "receipt": receipt,
            "error_code": code,
            "error": None if succeeded else dumps(error or {}),
            "finished_at": NOW,
        },
        decision=decision or code or "succeeded", clock=clock, duration_ms=duration_ms,
        receipt=fresh,
    )
    if row is None:
        return Completion(False, None)
    if not count_receipts:
        return Completion(True, None)
    if fresh is not None and conn.dialect.name == "postgresql":
        return Completion(True, int(row.accepted_receipts))
    return Completion(True, distinct_accepted_receipts(conn, operation_id))


def release_to_retry(
    conn: Connection,
    operation_id: str,
    generation: int,
    owner_token: str,
    *,
    delay_seconds: float,
    error_code: ErrorCode,
    error: dict[str, Any],
    decision: str | None = None,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """started → retry_wait, due again after `delay_seconds` on the database clock.

    The audit decision is the error code unless `decision` names it (the worker's
    `released_before_run`, which `earlier_attempt_may_have_run` reads)."""
    row = _transition(
        conn, operation_id, State.STARTED, State.RETRY_WAIT, _owner_holds(generation, owner_token),
        values={
            "available_at": Now(delay_seconds),
            "error_code": error_code.value,
            "error": dumps(error),
        },
        decision=decision or error_code.value, clock=clock,
    )
    return row is not None


def promote_due_retry(conn: Connection, operation_id: str, clock: Clock = DATABASE_CLOCK) -> bool:
    """retry_wait (available_at passed) → queued, with a fresh outbox row."""
    row = _transition(
        conn, operation_id, State.RETRY_WAIT, State.QUEUED, _DUE,
        values={"queued_at": NOW},
        decision="retry_due", clock=clock,
    )
    return row is not None


def mark_unknown(
    conn: Connection,
    operation_id: str,
    generation: int,
    *,
    owner_token: str,
    reason: str,
    details: Sequence[Mapping[str, Any]] = (),
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """started → reconciliation_pending, by the owner: the outcome of its write is not known.

    `details` are the failure's safe details (an MCP call's cause), kept in the
    operation's error for the person who decides it."""
    return _unknown_outcome(
        conn, operation_id, _owner_holds(generation, owner_token), reason, clock, actor=None,
        details=details,
    )


def mark_unknown_expired(
    conn: Connection,
    operation_id: str,
    generation: int,
    *,
    reason: str,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """started (lease expired, generation observed) → reconciliation_pending, by the
    reconciler: the owner is gone and the tool's effect contract leaves it to a person."""
    return _unknown_outcome(
        conn, operation_id, _lease_expired(generation), reason, clock,
        actor="reconciler",
    )


def _unknown_outcome(
    conn: Connection,
    operation_id: str,
    fence: Fence,
    reason: str,
    clock: Clock,
    *,
    actor: str | None,
    details: Sequence[Mapping[str, Any]] = (),
) -> bool:
    """What `mark_unknown` and `mark_unknown_expired` write; they differ only in the fence."""
    # The audit keeps stable codes: a free-text reason (a sentence, an exception's
    # text quoting arguments) stays on the operation's `error`, not in the
    # append-only trail, whose `decision_code` column is 64 characters.
    decision = (
        reason if DECISION_CODE.fullmatch(reason) else ErrorCode.RECONCILIATION_PENDING.value
    )
    row = _transition(
        conn, operation_id, State.STARTED, State.RECONCILIATION_PENDING, fence,
        values={
            "error_code": ErrorCode.RECONCILIATION_PENDING.value,
            "error": dumps(
                {"message": reason, "details": [dict(d) for d in details]}
                if details else {"message": reason}
            ),
        },
        decision=decision, clock=clock, actor=actor,
    )
    return row is not None


def mark_scope_exceeded(
    conn: Connection,
    operation_id: str,
    generation: int,
    *,
    owner_token: str,
    receipt: str | None,
    error: dict[str, Any],
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """started → reconciliation_pending, by the owner: its write took effect (the
    receipt is kept) but changed resources outside its approved set, so it is not
    `succeeded`; a person decides. `error` holds both sets, bounded
    (`executor.core.scope`), with the cause `approval_scope_exceeded`."""
    row = _transition(
        conn, operation_id, State.STARTED, State.RECONCILIATION_PENDING,
        _owner_holds(generation, owner_token),
        values={
            "error_code": ErrorCode.APPROVAL_SCOPE_EXCEEDED.value,
            "error": dumps(error),
            "receipt": receipt,
        },
        decision=ErrorCode.APPROVAL_SCOPE_EXCEEDED.value, clock=clock,
    )
    return row is not None


def fail_unstarted(
    conn: Connection,
    operation_id: str,
    error_code: ErrorCode,
    message: str,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """queued → failed_terminal without ever running (predecessor failed, policy changed)."""
    row = _transition(
        conn, operation_id, State.QUEUED, State.FAILED_TERMINAL,
        values={
            "error_code": error_code.value,
            "error": dumps({"message": message}),
            "finished_at": NOW,
        },
        decision=error_code.value, clock=clock,
    )
    return row is not None


def requeue_stale(
    conn: Connection, operation_id: str, generation: int, clock: Clock = DATABASE_CLOCK
) -> bool:
    """started (lease expired, generation observed) → queued, with a fresh outbox row.

    The next reservation takes a new generation, which fences the dead owner.
    """
    row = _transition(
        conn, operation_id, State.STARTED, State.QUEUED, _lease_expired(generation),
        values={"queued_at": NOW, "available_at": NOW},
        decision="requeued_stale", clock=clock, actor="reconciler",
    )
    return row is not None


def record_lookup_result(
    conn: Connection,
    operation_id: str,
    generation: int,
    *,
    result: Any,
    receipt: str | None,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """started (lease expired) → succeeded, from the downstream's own answer."""
    row = _transition(
        conn, operation_id, State.STARTED, State.SUCCEEDED, _lease_expired(generation),
        values={"result": dumps(result), "receipt": receipt, "finished_at": NOW},
        decision="lookup_done", clock=clock, actor="reconciler",
    )
    return row is not None


def republish_queued(
    conn: Connection,
    operation_id: str,
    clock: Clock = DATABASE_CLOCK,
    *,
    older_than_seconds: float,
) -> bool:
    """Refresh `queued_at` and add an outbox row: CAS on still queued and still that
    stale, so of two reconcilers that read it as stale only the first republishes.
    Not a transition (the state stays `queued`), so no audit event."""
    now = clock.now()
    won = (
        conn.execute(
            update(operations)
            .where(
                operations.c.operation_id == operation_id,
                keyed_state_is(operations.c.state, State.QUEUED),
                operations.c.queued_at < now - older_than_seconds,
            )
            .values(queued_at=now)
        ).rowcount
        == 1
    )
    if won:
        add_outbox_row(conn, operation_id, clock)
    return won


def resolve(
    conn: Connection,
    operation_id: str,
    *,
    to_state: State,
    actor: str,
    reference: str | None,
    message: str,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """reconciliation_pending → succeeded | failed_terminal | queued: an operator decides
    (audited with the actor)."""
    if to_state not in (State.SUCCEEDED, State.FAILED_TERMINAL, State.QUEUED):
        raise StoreError(f"cannot resolve to {to_state}")
    values: dict[str, Any] = {}
    if to_state is State.SUCCEEDED:
        values |= {
            "result": dumps({"resolved_by": actor, "reference": reference, "note": message}),
            "receipt": reference,
            "error_code": None,
            "error": None,
            "finished_at": NOW,
        }
    elif to_state is State.FAILED_TERMINAL:
        values |= {
            "error_code": ErrorCode.EXECUTION_FAILED.value,
            "error": dumps({"message": message or "resolved as failed by an operator"}),
            "finished_at": NOW,
        }
    else:
        values |= {"queued_at": NOW, "available_at": NOW}
    row = _transition(
        conn, operation_id, State.RECONCILIATION_PENDING, to_state,
        values=values,
        decision=f"resolved_{to_state.value}", clock=clock, actor=actor,
    )
    return row is not None
