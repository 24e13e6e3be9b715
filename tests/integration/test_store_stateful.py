"""The operation store against a model: a Hypothesis state machine.

Each step is one store statement, in its own transaction, on a `ManualClock` the
machine steps by hand. The model is a few lines of Python per statement saying
when that statement must win and what it leaves behind; after every step the
database must agree with the model, every audit event must be a legal
transition, generations only grow and at most one owner holds a live lease.
Runs on SQLite and on PostgreSQL (the `db_url` fixture: a fresh database each).
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, event, select

from executor import store
from executor.core.states import State, is_legal
from executor.core.types import ErrorCode
from executor.store import Created, NewOperation
from executor.store.clock import ManualClock
from executor.store.engine import make_engine
from executor.store.schema import audit_events, operations

LEASE = 30.0
INTENT = hashlib.sha256(b"charge").hexdigest()
# "current" resolves to whoever the model says holds the operation now, so the
# live owner acts about as often as a stale one or a stranger.
OWNERS = st.sampled_from(["current", "current", "A", "B", "C"])
# Which operation a rule acts on: mostly one in a state where the statement could
# win (so wins are frequent), sometimes any operation (so must-lose CASes are too).
PICKS = st.tuples(st.integers(0, 3), st.integers(0, 255))
STARTED = {State.STARTED}


@dataclass
class ModelOperation:
    state: State = State.QUEUED
    generation: int = 0
    owner_token: str | None = None
    owner_name: str | None = None
    lease_expires_at: float | None = None
    available_at: float = 0.0
    transitions: list[tuple[str | None, str]] = field(default_factory=list)

    def move(self, to_state: State) -> None:
        self.transitions.append((self.state.value, to_state.value))
        self.state = to_state

    def release_ownership(self) -> None:
        self.owner_token = None
        self.owner_name = None
        self.lease_expires_at = None


has_operations = precondition(lambda machine: bool(machine.model))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine
        self.clock = ManualClock(1_000_000.0)
        self.prefix = f"sm-{uuid.uuid4().hex[:10]}"
        self.model: dict[str, ModelOperation] = {}
        # What each owner believes it holds: its latest (generation, owner_token).
        self.held: dict[tuple[str, str], tuple[int, str]] = {}
        self.highest_generation: dict[str, int] = {}
        self.tokens = itertools.count()

    # ----------------------------------------------------------------- helpers

    @property
    def now(self) -> float:
        return self.clock.value

    def choose(self, pick: tuple[int, int], states: set[State]) -> str:
        wander, index = pick
        candidates = [op for op, m in self.model.items() if wander == 0 or m.state in states]
        if not candidates:
            candidates = list(self.model)
        return candidates[index % len(candidates)]

    def who(self, operation_id: str, owner: str) -> str:
        if owner == "current":
            return self.model[operation_id].owner_name or "A"
        return owner

    def credentials(self, operation_id: str, owner: str) -> tuple[int, str]:
        owner = self.who(operation_id, owner)
        return self.held.get((operation_id, owner), (0, f"{owner}-never-held"))

    def owns(self, operation_id: str, generation: int, token: str) -> bool:
        m = self.model[operation_id]
        return m.state is State.STARTED and (m.generation, m.owner_token) == (generation, token)

    def lease_expired(self, m: ModelOperation) -> bool:
        return m.lease_expires_at is not None and m.lease_expires_at < self.now

    def take_ownership(self, operation_id: str, owner: str, token: str) -> None:
        m = self.model[operation_id]
        m.generation += 1
        m.owner_token = token
        m.owner_name = owner
        m.lease_expires_at = self.now + LEASE
        self.held[(operation_id, owner)] = (m.generation, token)

    # ----------------------------------------------------------------- rules

    @initialize()
    def some_operations_running(self) -> None:
        # Every run starts with something to act on, whichever rules it favours
        # (Hypothesis may leave some rules out of a run entirely): two running
        # operations and a queued one.
        for _ in range(3):
            self.register()
        self.reserve((1, 0), "A")
        self.reserve((1, 0), "B")

    @precondition(lambda machine: len(machine.model) < 4)
    @rule()
    def register(self) -> None:
        operation_id = f"{self.prefix}-{len(self.model)}"
        with self.engine.begin() as conn:
            created = store.register(
                conn,
                NewOperation(
                    operation_id=operation_id, request_id=operation_id, call_id="c", position=0,
                    tool_name="charge", schema_version=1, mode="write", intent_hash=INTENT,
                    arguments={}, context={}, needs_approval=False, impact=None,
                ),
                clock=self.clock,
            )
        assert isinstance(created, Created)
        self.model[operation_id] = ModelOperation(
            available_at=self.now, transitions=[(None, State.QUEUED.value)]
        )

    @has_operations
    @rule(pick=PICKS, owner=OWNERS)
    def reserve(self, pick: tuple[int, int], owner: str) -> None:
        operation_id = self.choose(pick, {State.QUEUED})
        m = self.model[operation_id]
        owner = self.who(operation_id, owner)
        token = f"{owner}-{next(self.tokens)}"
        with self.engine.begin() as conn:
            won = store.reserve(conn, operation_id, token, LEASE, clock=self.clock)
        should_win = m.state is State.QUEUED and m.available_at <= self.now
        assert (won is not None) == should_win
        if won is not None:
            m.move(State.STARTED)
            self.take_ownership(operation_id, owner, token)
            assert (won.generation, won.took_over) == (m.generation, False)

    @has_operations
    @rule(pick=PICKS, owner=OWNERS)
    def take_over(self, pick: tuple[int, int], owner: str) -> None:
        operation_id = self.choose(pick, STARTED)
        m = self.model[operation_id]
        owner = self.who(operation_id, owner)
        token = f"{owner}-{next(self.tokens)}"
        with self.engine.begin() as conn:
            won = store.take_over(conn, operation_id, token, LEASE, clock=self.clock)
        should_win = m.state is State.STARTED and self.lease_expired(m)
        assert (won is not None) == should_win
        if won is not None:
            m.move(State.STARTED)
            self.take_ownership(operation_id, owner, token)
            assert (won.generation, won.took_over) == (m.generation, True)

    @has_operations
    @rule(pick=PICKS, owner=OWNERS)
    def lease_lapses_then_take_over(self, pick: tuple[int, int], owner: str) -> None:
        # The scenario the fencing exists for: an owner goes quiet past its lease
        # and another worker takes the operation over.
        self.clock.advance(LEASE + 1.0)
        self.take_over(pick, owner)

    @has_operations
    @rule(pick=PICKS, observed_stale=st.booleans())
    def lease_lapses_then_requeue(self, pick: tuple[int, int], observed_stale: bool) -> None:
        self.clock.advance(LEASE + 1.0)
        self.requeue_stale(pick, observed_stale)

    @has_operations
    @rule(pick=PICKS, owner=OWNERS)
    def renew(self, pick: tuple[int, int], owner: str) -> None:
        operation_id = self.choose(pick, STARTED)
        m = self.model[operation_id]
        generation, token = self.credentials(operation_id, owner)
        with self.engine.begin() as conn:
            expiry = store.renew(conn, operation_id, generation, token, LEASE, clock=self.clock)
        should_win = (
            self.owns(operation_id, generation, token)
            and m.lease_expires_at is not None
            and m.lease_expires_at > self.now
        )
        assert (expiry is not None) == should_win
        if expiry is not None:
            m.lease_expires_at = self.now + LEASE
            assert expiry == m.lease_expires_at

    @has_operations
    @rule(pick=PICKS, owner=OWNERS, succeeded=st.booleans())
    def complete(self, pick: tuple[int, int], owner: str, succeeded: bool) -> None:
        operation_id = self.choose(pick, STARTED)
        # The owner may be current or stale: the model decides which it is.
        m = self.model[operation_id]
        generation, token = self.credentials(operation_id, owner)
        with self.engine.begin() as conn:
            won = store.complete(
                conn, operation_id, generation, token, INTENT, succeeded=succeeded,
                result={"by": token}, clock=self.clock,
            )
        assert won == self.owns(operation_id, generation, token)
        if won:
            m.move(State.SUCCEEDED if succeeded else State.FAILED_TERMINAL)
            m.release_ownership()

    @has_operations
    @rule(pick=PICKS, owner=OWNERS, delay=st.sampled_from([0.0, 5.0, 60.0]))
    def release_to_retry(self, pick: tuple[int, int], owner: str, delay: float) -> None:
        operation_id = self.choose(pick, STARTED)
        m = self.model[operation_id]
        generation, token = self.credentials(operation_id, owner)
        with self.engine.begin() as conn:
            won = store.release_to_retry(
                conn, operation_id, generation, token, delay_seconds=delay,
                error_code=ErrorCode.UPSTREAM_UNAVAILABLE, error={}, clock=self.clock,
            )
        assert won == self.owns(operation_id, generation, token)
        if won:
            m.move(State.RETRY_WAIT)
            m.release_ownership()
            m.available_at = self.now + delay

    @rule(seconds=st.sampled_from([1.0, LEASE / 2, LEASE, LEASE + 1.0, LEASE + 1.0, 61.0]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @has_operations
    @rule(pick=PICKS)
    def promote_due_retry(self, pick: tuple[int, int]) -> None:
        operation_id = self.choose(pick, {State.RETRY_WAIT})
        m = self.model[operation_id]
        with self.engine.begin() as conn:
            won = store.promote_due_retry(conn, operation_id, clock=self.clock)
        assert won == (m.state is State.RETRY_WAIT and m.available_at <= self.now)
        if won:
            m.move(State.QUEUED)

    @has_operations
    @rule(pick=PICKS, observed_stale=st.sampled_from([False, False, False, True]))
    def requeue_stale(self, pick: tuple[int, int], observed_stale: bool) -> None:
        operation_id = self.choose(pick, STARTED)
        # The reconciler acts on the generation it observed, maybe one that moved on.
        m = self.model[operation_id]
        observed = m.generation - 1 if observed_stale else m.generation
        with self.engine.begin() as conn:
            won = store.requeue_stale(conn, operation_id, observed, clock=self.clock)
        assert won == (
            m.state is State.STARTED and m.generation == observed and self.lease_expired(m)
        )
        if won:
            m.move(State.QUEUED)
            m.release_ownership()
            m.available_at = self.now

    @has_operations
    @rule(pick=PICKS, owner=st.none() | OWNERS)
    def mark_unknown(self, pick: tuple[int, int], owner: str | None) -> None:
        operation_id = self.choose(pick, STARTED)
        m = self.model[operation_id]
        if owner is None:  # the reconciler, on the generation it observes now
            generation, token = m.generation, None
            should_win = m.state is State.STARTED and self.lease_expired(m)
        else:
            generation, token = self.credentials(operation_id, owner)
            should_win = self.owns(operation_id, generation, token)
        with self.engine.begin() as conn:
            if token is None:
                won = store.mark_unknown_expired(
                    conn, operation_id, generation, reason="outcome_unknown", clock=self.clock
                )
            else:
                won = store.mark_unknown(
                    conn, operation_id, generation, owner_token=token, reason="outcome_unknown",
                    clock=self.clock,
                )
        assert won == should_win
        if won:
            m.move(State.RECONCILIATION_PENDING)
            m.release_ownership()

    # ----------------------------------------------------------------- invariants

    @invariant()
    def store_agrees_with_model(self) -> None:
        if not self.model:
            return
        ids = list(self.model)
        with self.engine.connect() as conn:
            rows = {
                r.operation_id: r
                for r in conn.execute(select(operations).where(operations.c.operation_id.in_(ids)))
            }
            events = list(
                conn.execute(
                    select(audit_events)
                    .where(audit_events.c.operation_id.in_(ids))
                    .order_by(audit_events.c.event_id)
                )
            )
            # Ask the store itself who holds a live lease, for every owner that ever
            # held a running operation (a row not `started` has no owner at all: the
            # row check below covers it).
            live_owners = {
                operation_id: [
                    credentials
                    for (op, _), credentials in self.held.items()
                    if op == operation_id
                    and store.still_owner(conn, operation_id, *credentials, clock=self.clock)
                ]
                for operation_id in ids
                if operation_id in rows and rows[operation_id].state == State.STARTED.value
            }
        self.check_rows(rows)
        self.check_generation_monotonic(rows)
        self.check_at_most_one_live_owner(live_owners)
        self.check_audit_trail(events)

    def check_rows(self, rows: dict[str, Any]) -> None:
        assert set(rows) == set(self.model)
        for operation_id, m in self.model.items():
            row = rows[operation_id]
            assert (
                row.state, row.generation, row.owner_token, row.lease_expires_at, row.available_at
            ) == (m.state.value, m.generation, m.owner_token, m.lease_expires_at, m.available_at)

    def check_generation_monotonic(self, rows: dict[str, Any]) -> None:
        for operation_id, row in rows.items():
            assert row.generation >= self.highest_generation.get(operation_id, 0)
            self.highest_generation[operation_id] = row.generation

    def check_at_most_one_live_owner(self, live_owners: dict[str, list[tuple[int, str]]]) -> None:
        for operation_id, live in live_owners.items():
            assert len(live) <= 1, live
            m = self.model[operation_id]
            if live:
                assert live == [(m.generation, m.owner_token)]

    def check_audit_trail(self, events: list[Any]) -> None:
        by_operation: dict[str, list[tuple[str | None, str]]] = {op: [] for op in self.model}
        generations: dict[str, int] = {}
        for audited in events:
            assert is_legal(audited.from_state, audited.to_state), audited
            assert audited.generation >= generations.get(audited.operation_id, 0)
            generations[audited.operation_id] = audited.generation
            by_operation[audited.operation_id].append((audited.from_state, audited.to_state))
        assert by_operation == {op: m.transitions for op, m in self.model.items()}


def fast_engine(url: str) -> Engine:
    """An engine for thousands of one-statement transactions.

    No pre-ping on checkout, and commits do not wait for the disk: visibility,
    locking and the SQL under test are unchanged; only durability across a crash
    of the machine, which this test does not exercise, is given up.
    """
    engine = make_engine(url, pool_pre_ping=False)

    @event.listens_for(engine, "connect")
    def _no_sync(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        if engine.dialect.name == "postgresql":
            cursor.execute("SET synchronous_commit = off")
            dbapi_connection.commit()
        else:
            cursor.execute("PRAGMA synchronous = OFF")
        cursor.close()

    return engine


def test_store__state_machine_against_model(db_url: str) -> None:
    engine = fast_engine(db_url)
    try:
        run_state_machine_as_test(
            lambda: StoreMachine(engine),
            settings=settings(
                max_examples=25,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        engine.dispose()
