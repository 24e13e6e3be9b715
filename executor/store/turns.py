"""The turn store: every state-changing statement on a turn, in one place.

The fencing argument is the operations' (executor/store/operations.py), for a
turn. A turn is run only by the holder of its current `(generation,
owner_token)`. `reserve_turn` is the only statement that hands out ownership:
one compare-and-set on a `running` turn that has no owner or whose lease
expired, adding one to `generation` and writing a fresh owner token and a lease
on the database clock. Every later write by the owner (`renew_turn`,
`record_step`, `end_turn`, `wait_for_approval`, `release_turn`) repeats the CAS
on `(turn_id, state='running', generation, owner_token)`, so once anyone has
taken over, the old owner's writes match no row. A step is checkpointed by
`record_step` in the same transaction as that CAS, keyed by (turn, step): a
step is recorded once, by one generation, before its calls are enqueued, and a
resumed turn reads it back instead of asking the model again.

"One running turn per user" is the database's: the partial unique index
`ux_toolfence_turns_running` on (tenant, scope_key) WHERE state = 'running'.
`insert_turn` is an INSERT … ON CONFLICT on that index DO NOTHING, so a second
turn is refused without an exception in the caller's transaction (or, by
setting, written `queued`, and promoted by `promote_queued_turn` when the scope
is free); a waiting turn's resume (`wake_turn`) that would be a second running
one stays waiting.

The reconciler's statements (`requeue_stale_turn`, `republish_turn`,
`wake_turn`, `promote_queued_turn`) CAS on what they observed (a generation and an expired
lease, an unchanged `updated_at`, a state), so they never race a live owner.
Each function runs in the caller's transaction and returns whether it won.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, and_, exists, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from executor.core.sanitize import redact_json, seal_final_output
from executor.core.states import State, TurnState
from executor.store.audit import dumps
from executor.store.clock import DATABASE_CLOCK, Clock
from executor.store.ordering import sql_literal
from executor.store.schema import operations, outbox, turn_steps, turns

TURN_OUTBOX_KIND = "turn"


@dataclass(frozen=True)
class TurnLease:
    turn_id: str
    generation: int
    owner_token: str
    lease_expires_at: float
    took_over: bool


@dataclass(frozen=True)
class StaleTurn:
    turn_id: str
    generation: int


def new_turn_id() -> str:
    return "turn_" + secrets.token_hex(16)


def add_turn_outbox_row(
    conn: Connection, turn_id: str, clock: Clock = DATABASE_CLOCK, delay_seconds: float = 0.0
) -> None:
    """Ask the relay to publish the turn job (in the caller's transaction)."""
    now = clock.now()
    conn.execute(
        insert(outbox).values(
            operation_id=turn_id, kind=TURN_OUTBOX_KIND, created_at=now,
            next_attempt_at=now + delay_seconds if delay_seconds else now, attempts=0,
        )
    )


def insert_turn(
    conn: Connection,
    *,
    turn_id: str,
    tenant: str,
    principal: str,
    conversation_id: str,
    scope_key: str,
    context: Mapping[str, Any],
    message: str,
    driver: str,
    options: Mapping[str, Any],
    queue_when_busy: bool = False,
    trace_context: str | None = None,
    clock: Clock = DATABASE_CLOCK,
) -> TurnState | None:
    """A new `running` turn and its outbox row. When the tenant's scope already has a
    running turn (the partial unique index decides): None, nothing written, or with
    `queue_when_busy` a `queued` turn (no outbox row) that runs once the scope is free."""
    now = conn.execute(select(clock.now())).scalar_one()
    values = {
        "turn_id": turn_id, "tenant": tenant, "principal": principal,
        "conversation_id": conversation_id, "scope_key": scope_key, "context": dumps(dict(context)),
        "message": message, "driver": driver, "options": dumps(dict(options)),
        "state": TurnState.RUNNING.value, "generation": 0, "steps": 0,
        "created_at": now, "updated_at": now, "trace_context": trace_context,
    }
    # The partial index's predicate as a literal, never a bound parameter: once psycopg
    # has prepared the statement on a connection and PostgreSQL plans it generically
    # (from its eleventh execution), `WHERE state = $1` proves nothing about the index's
    # `WHERE state = 'running'`, and PostgreSQL answers "no unique or exclusion
    # constraint matching the ON CONFLICT specification" (docs/decisions/0194).
    running = turns.c.state == sql_literal(TurnState.RUNNING)
    ins: Any
    if conn.dialect.name == "postgresql":
        ins = postgresql.insert(turns).values(**values).on_conflict_do_nothing(
            index_elements=[turns.c.tenant, turns.c.scope_key], index_where=running,
        )
    else:
        ins = sqlite.insert(turns).values(**values).on_conflict_do_nothing(
            index_elements=[turns.c.tenant, turns.c.scope_key], index_where=running,
        )
    inserted = conn.execute(ins.returning(turns.c.turn_id)).first() is not None
    if inserted:
        add_turn_outbox_row(conn, turn_id, clock)
        return TurnState.RUNNING
    if not queue_when_busy:
        return None
    conn.execute(insert(turns).values(**{**values, "state": TurnState.QUEUED.value}))
    return TurnState.QUEUED


def promote_queued_turn(conn: Connection, tenant: str, scope_key: str, clock: Clock = DATABASE_CLOCK) -> bool:
    """The oldest `queued` turn of the scope → `running`, with its outbox row, if the
    scope has no running turn. In a savepoint: when another turn got there first, the
    unique index refuses it and the caller's transaction is unharmed."""
    oldest = conn.execute(
        select(turns.c.turn_id)
        .where(turns.c.tenant == tenant, turns.c.scope_key == scope_key,
               turns.c.state == TurnState.QUEUED.value)
        .order_by(turns.c.created_at, turns.c.turn_id)
        .limit(1)
    ).scalar_one_or_none()
    if oldest is None:
        return False
    try:
        with conn.begin_nested():
            won = conn.execute(
                update(turns)
                .where(turns.c.turn_id == oldest, turns.c.state == TurnState.QUEUED.value)
                .values(state=TurnState.RUNNING.value, updated_at=clock.now())
            ).rowcount == 1
    except IntegrityError:
        return False
    if won:
        add_turn_outbox_row(conn, oldest, clock)
    return won


def free_scopes_with_queued_turns(conn: Connection, limit: int) -> list[str]:
    """`tenant NUL scope_key` of scopes with a queued turn and no running one (the
    reconciler's net under `promote_queued_turn`, which the owner calls as it ends)."""
    running = turns.alias("running")
    busy = exists().where(
        running.c.tenant == turns.c.tenant, running.c.scope_key == turns.c.scope_key,
        running.c.state == sql_literal(TurnState.RUNNING),  # ux_toolfence_turns_running
    ).correlate(turns)
    rows = conn.execute(
        select(turns.c.tenant, turns.c.scope_key)
        .where(turns.c.state == TurnState.QUEUED.value, ~busy)
        .distinct()
        .limit(limit)
    ).all()
    return [f"{r.tenant}\0{r.scope_key}" for r in rows]


def _owner_holds(turn_id: str, generation: int, owner_token: str) -> ColumnElement[bool]:
    return and_(
        turns.c.turn_id == turn_id,
        turns.c.state == TurnState.RUNNING.value,
        turns.c.generation == generation,
        turns.c.owner_token == owner_token,
    )


def reserve_turn(
    conn: Connection, turn_id: str, owner_token: str, lease_seconds: float, clock: Clock = DATABASE_CLOCK
) -> TurnLease | None:
    """running (no owner, or its lease expired) → running with generation+1, an owner
    token and a lease on the database clock. One CAS: two reservers never both win."""
    now = clock.now()
    row = conn.execute(
        update(turns)
        .where(
            turns.c.turn_id == turn_id,
            turns.c.state == TurnState.RUNNING.value,
            or_(turns.c.owner_token.is_(None), turns.c.lease_expires_at < now),
        )
        .values(
            generation=turns.c.generation + 1, owner_token=owner_token,
            lease_expires_at=now + lease_seconds, updated_at=now,
        )
        .returning(turns.c.generation, turns.c.lease_expires_at)
    ).one_or_none()
    if row is None:
        return None
    return TurnLease(turn_id, row.generation, owner_token, row.lease_expires_at, row.generation > 1)


def renew_turn(
    conn: Connection, turn_id: str, generation: int, owner_token: str, lease_seconds: float,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """Extend a live lease (an expired one is not revived: the reconciler may be acting).
    Also the owner's fence around writes made in the same transaction (an enqueue):
    on PostgreSQL the row stays locked until commit, so a take-over waits for it."""
    now = clock.now()
    return conn.execute(
        update(turns)
        .where(_owner_holds(turn_id, generation, owner_token), turns.c.lease_expires_at > now)
        .values(lease_expires_at=now + lease_seconds, updated_at=now)
    ).rowcount == 1


def record_step(
    conn: Connection,
    lease: TurnLease,
    *,
    step: int,
    outcome: str,
    proposals: Sequence[Mapping[str, Any]],
    request_id: str,
    usage: Mapping[str, Any],
    final_output: str | None = None,
    error: Mapping[str, Any] | None = None,
    verdict: str | None = None,
    offered: Sequence[str] | None = None,
    trace_context: str | None = None,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """Checkpoint one model step: CAS on the owner *and* on the step count (steps =
    step - 1), then the step row, in one transaction. A stale owner, or a second
    recording of one step, changes nothing. The step's final output and error are
    stored sanitised (`seal_final_output`): every reader is shown the same safe text.
    `offered`: the ids of the items the surface listed at this step (already checked
    identifiers, `executor.core.surfaces.checked_targets`)."""
    now = clock.now()
    won = conn.execute(
        update(turns)
        .where(_owner_holds(lease.turn_id, lease.generation, lease.owner_token), turns.c.steps == step - 1)
        .values(steps=step, updated_at=now)
    ).rowcount == 1
    if not won:
        return False
    conn.execute(
        insert(turn_steps).values(
            turn_id=lease.turn_id, step=step, outcome=outcome, proposals=dumps(list(proposals)),
            final_output=seal_final_output(final_output), error=_sealed(error),
            verdict=verdict, usage=dumps(dict(usage)), request_id=request_id,
            generation=lease.generation, recorded_at=now,
            offered=None if offered is None else dumps(list(offered)),
            trace_context=trace_context,
        )
    )
    return True


def end_turn(
    conn: Connection,
    lease: TurnLease,
    *,
    state: TurnState,
    end_reason: str,
    final_output: str | None,
    error: Mapping[str, Any] | None = None,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """running → succeeded | failed | fallback, by the owner; the final output and
    error stored sanitised, as `record_step` stores a step's."""
    if state not in (TurnState.SUCCEEDED, TurnState.FAILED, TurnState.FALLBACK):
        raise ValueError(f"not an end state: {state}")
    now = clock.now()
    row = conn.execute(
        update(turns)
        .where(_owner_holds(lease.turn_id, lease.generation, lease.owner_token))
        .values(
            state=state.value, end_reason=end_reason, final_output=seal_final_output(final_output),
            error=_sealed(error),
            owner_token=None, lease_expires_at=None, updated_at=now, finished_at=now,
        )
        .returning(turns.c.tenant, turns.c.scope_key)
    ).one_or_none()
    if row is None:
        return False
    # The scope is free: the turn queued behind this one (if any) runs next.
    promote_queued_turn(conn, row.tenant, row.scope_key, clock)
    return True


def _sealed(error: Mapping[str, Any] | None) -> str | None:
    """A step's or a turn's error as stored: it can quote the model's text (a contract
    error's excerpt), so it goes through the sanitiser like the final output."""
    return None if error is None else dumps(redact_json(dict(error)))


def wait_for_approval(conn: Connection, lease: TurnLease, clock: Clock = DATABASE_CLOCK) -> bool:
    """running → waiting_approval, by the owner, giving up ownership: nothing runs
    until a person decides (`wake_turn` brings it back). A waiting turn is not
    running: a turn queued behind it runs meanwhile."""
    row = conn.execute(
        update(turns)
        .where(_owner_holds(lease.turn_id, lease.generation, lease.owner_token))
        .values(
            state=TurnState.WAITING_APPROVAL.value, owner_token=None, lease_expires_at=None,
            updated_at=clock.now(),
        )
        .returning(turns.c.tenant, turns.c.scope_key)
    ).one_or_none()
    if row is None:
        return False
    promote_queued_turn(conn, row.tenant, row.scope_key, clock)
    return True


def release_turn(
    conn: Connection, lease: TurnLease, *, delay_seconds: float, clock: Clock = DATABASE_CLOCK
) -> bool:
    """The owner gives the turn back (its calls are still running) and schedules its
    own job again in `delay_seconds`: a worker is never held waiting for long."""
    won = conn.execute(
        update(turns)
        .where(_owner_holds(lease.turn_id, lease.generation, lease.owner_token))
        .values(owner_token=None, lease_expires_at=None, updated_at=clock.now())
    ).rowcount == 1
    if won:
        add_turn_outbox_row(conn, lease.turn_id, clock, delay_seconds=delay_seconds)
    return won


def stale_turns(conn: Connection, limit: int, clock: Clock = DATABASE_CLOCK) -> list[StaleTurn]:
    """Running turns whose owner's lease expired (its worker died)."""
    rows = conn.execute(
        select(turns.c.turn_id, turns.c.generation)
        .where(
            turns.c.state == sql_literal(TurnState.RUNNING),  # ix_toolfence_turns_stale
            turns.c.owner_token.is_not(None),
            turns.c.lease_expires_at < clock.now(),
        )
        .order_by(turns.c.lease_expires_at)
        .limit(limit)
    ).all()
    return [StaleTurn(r.turn_id, r.generation) for r in rows]


def requeue_stale_turn(
    conn: Connection, turn_id: str, generation: int, clock: Clock = DATABASE_CLOCK
) -> bool:
    """running (lease expired, generation observed) → running without an owner, with a
    fresh outbox row. The next reservation takes a new generation, fencing the dead one."""
    now = clock.now()
    won = conn.execute(
        update(turns)
        .where(
            turns.c.turn_id == turn_id, turns.c.state == TurnState.RUNNING.value,
            turns.c.generation == generation, turns.c.lease_expires_at < now,
        )
        .values(owner_token=None, lease_expires_at=None, updated_at=now)
    ).rowcount == 1
    if won:
        add_turn_outbox_row(conn, turn_id, clock)
    return won


def unowned_turns(
    conn: Connection, older_than_seconds: float, limit: int, clock: Clock = DATABASE_CLOCK
) -> list[str]:
    """Running turns nobody owns, untouched for a while, with no outbox row waiting:
    their message was lost (a broker restart, a killed consumer)."""
    waiting = exists().where(
        outbox.c.operation_id == turns.c.turn_id, outbox.c.kind == TURN_OUTBOX_KIND,
        outbox.c.published_at.is_(None),
    ).correlate(turns)
    return list(
        conn.execute(
            select(turns.c.turn_id)
            .where(
                turns.c.state == TurnState.RUNNING.value, turns.c.owner_token.is_(None),
                turns.c.updated_at < clock.now() - older_than_seconds, ~waiting,
            )
            .limit(limit)
        ).scalars()
    )


def republish_turn(
    conn: Connection, turn_id: str, older_than_seconds: float, clock: Clock = DATABASE_CLOCK
) -> bool:
    """Refresh `updated_at` and add an outbox row, CAS on still unowned and that old."""
    now = clock.now()
    won = conn.execute(
        update(turns)
        .where(
            turns.c.turn_id == turn_id, turns.c.state == TurnState.RUNNING.value,
            turns.c.owner_token.is_(None), turns.c.updated_at < now - older_than_seconds,
        )
        .values(updated_at=now)
    ).rowcount == 1
    if won:
        add_turn_outbox_row(conn, turn_id, clock)
    return won


def _last_request_id() -> Any:
    return (
        select(turn_steps.c.request_id)
        .where(turn_steps.c.turn_id == turns.c.turn_id, turn_steps.c.step == turns.c.steps)
        # Correlated to the outer turn: nested in EXISTS, it would otherwise take
        # `toolfence_turns` into its own FROM and answer for every turn at once.
        .correlate(turns)
        .scalar_subquery()
    )


def decided_waiting_turns(conn: Connection, limit: int) -> list[str]:
    """Waiting turns whose last step has no call waiting for a person any more."""
    still_pending = exists().where(
        operations.c.tenant == turns.c.tenant,
        operations.c.request_id == _last_request_id(),
        operations.c.state == State.PENDING_APPROVAL.value,
    ).correlate(turns)
    return list(
        conn.execute(
            select(turns.c.turn_id)
            .where(turns.c.state == sql_literal(TurnState.WAITING_APPROVAL), ~still_pending)
            .order_by(turns.c.updated_at)
            .limit(limit)
        ).scalars()
    )


def wake_turn(conn: Connection, turn_id: str, clock: Clock = DATABASE_CLOCK) -> bool:
    """waiting_approval → running (no owner) with an outbox row. Inside a savepoint:
    when the user already has another running turn, the unique index refuses the
    change, the turn stays waiting (tried again next sweep) and the caller's
    transaction is unharmed."""
    try:
        with conn.begin_nested():
            won = conn.execute(
                update(turns)
                .where(turns.c.turn_id == turn_id, turns.c.state == TurnState.WAITING_APPROVAL.value)
                .values(state=TurnState.RUNNING.value, updated_at=clock.now())
            ).rowcount == 1
    except IntegrityError:
        return False
    if won:
        add_turn_outbox_row(conn, turn_id, clock)
    return won


# ------------------------------------------------------------------ reads


def get_turn(conn: Connection, turn_id: str) -> Row[Any] | None:
    return conn.execute(select(turns).where(turns.c.turn_id == turn_id)).one_or_none()


def steps_of(conn: Connection, turn_id: str) -> list[Row[Any]]:
    return list(
        conn.execute(select(turn_steps).where(turn_steps.c.turn_id == turn_id).order_by(turn_steps.c.step))
    )


def turn_lease_remaining(conn: Connection, turn_id: str, clock: Clock = DATABASE_CLOCK) -> float | None:
    row = conn.execute(
        select(turns.c.lease_expires_at - clock.now()).where(
            turns.c.turn_id == turn_id, turns.c.owner_token.is_not(None)
        )
    ).scalar_one_or_none()
    return None if row is None else float(row)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
