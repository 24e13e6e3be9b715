"""One reconciler sweep against real PostgreSQL, through the store, without a fleet.

Operations are made stale the way a dead worker leaves them: registered, reserved
with a lease of a few milliseconds on the database clock, and never renewed. The
tools are declared here, one per effect contract, so each test decides what the
downstream's lookup answers.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Connection, Engine, func, select, update

from executor import store
from executor.core.tools import (
    Access,
    Approval,
    Effect,
    LookupAnswer,
    LookupResult,
    Mode,
    Registry,
    RetryableError,
    RunContext,
    Tool,
    Written,
)
from executor.core.types import ErrorCode
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.store.schema import approvals, operations, outbox, receipts
from reconciler.sweep import Reconciler, SweepReport

TINY_LEASE = 0.02
QUEUED_AFTER = 60.0  # a queued operation's message counts as lost after this long


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    account_id: str


class Out(BaseModel):
    receipt: str


class Downstream:
    """What the fake downstream's lookup answers, per operation id."""

    def __init__(self) -> None:
        self.answers: dict[str, Callable[[], LookupResult]] = {}
        self.lookups: list[str] = []
        self._lock = threading.Lock()

    def lookup(self, args: Args, ctx: RunContext) -> LookupResult:
        with self._lock:
            self.lookups.append(ctx.operation_id)
        answer = self.answers.get(ctx.operation_id)
        return answer() if answer else LookupResult(LookupAnswer.NOT_DONE)


def _never_run(args: Args, ctx: RunContext) -> Written:
    raise AssertionError("the reconciler never runs a tool")


def _tool(name: str, mode: Mode, effects: list[Effect] | None, downstream: Downstream) -> Tool[Args]:
    extra: dict[str, Any] = {}
    if effects is not None:
        extra["effect"] = effects
    if effects and Effect.LOOKUP in effects:
        extra["lookup"] = downstream.lookup
    return Tool(
        name=name, description=name, mode=mode, input_model=Args, output_model=Out,
        run=_never_run, access=Access.public_tool(), approval=Approval.never(),
        untrusted_output=False, **extra,
    )


@pytest.fixture
def downstream() -> Downstream:
    return Downstream()


@pytest.fixture
def registry(downstream: Downstream) -> Registry:
    return Registry(
        [
            _tool("t.read", Mode.READ, None, downstream),
            _tool("t.idempotent", Mode.WRITE, [Effect.IDEMPOTENT], downstream),
            _tool("t.fenced", Mode.WRITE, [Effect.FENCED], downstream),
            _tool("t.lookup", Mode.WRITE, [Effect.LOOKUP], downstream),
            _tool("t.unsafe", Mode.WRITE, [Effect.UNSAFE], downstream),
        ]
    )


@pytest.fixture
def settings(pg_url: str) -> Settings:
    return Settings(
        database_url=pg_url, broker_url="memory://", reconcile_batch_size=50,
        reconcile_queued_after_seconds=QUEUED_AFTER,
    )


@pytest.fixture
def db(pg_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture
def reconciler(settings: Settings, db: Engine, registry: Registry) -> Reconciler:
    return Reconciler(settings, db, registry)


# ----------------------------------------------------------------- helpers


def _new_operation(
    tool_name: str, *, request_id: str | None, position: int, needs_approval: bool,
    approval_ttl: float, arguments: dict[str, Any] | None,
) -> store.NewOperation:
    operation_id = f"op-{uuid.uuid4().hex[:12]}"
    request_id = request_id or f"req-{operation_id}"
    return store.NewOperation(
        operation_id=operation_id, request_id=request_id, call_id=f"call-{position}",
        position=position, tool_name=tool_name, schema_version=1,
        mode="read" if tool_name == "t.read" else "write",
        intent_hash=hashlib.sha256(operation_id.encode()).hexdigest(),
        arguments=arguments if arguments is not None else {"account_id": "acct-1"},
        context={"principal": "alice", "tenant": "acme", "roles": ["member"], "request_id": request_id},
        needs_approval=needs_approval, impact={"note": "x"} if needs_approval else None,
        approval_ttl_seconds=approval_ttl,
    )


def _register(conn: Connection, new: store.NewOperation) -> None:
    assert isinstance(store.register(conn, new), store.Created)
    if not new.needs_approval:
        store.add_outbox_row(conn, new.operation_id)  # as the producer does


def register(
    db: Engine, tool_name: str, *, request_id: str | None = None, position: int = 0,
    needs_approval: bool = False, approval_ttl: float = 3600.0,
    arguments: dict[str, Any] | None = None,
) -> str:
    new = _new_operation(
        tool_name, request_id=request_id, position=position, needs_approval=needs_approval,
        approval_ttl=approval_ttl, arguments=arguments,
    )
    with db.begin() as conn:
        _register(conn, new)
    return new.operation_id


def make_stale_many(
    db: Engine, tool_names: list[str], arguments: dict[str, Any] | None = None
) -> list[tuple[str, int]]:
    """`started` operations whose owner died: reserved with a tiny lease, never renewed."""
    made = []
    with db.begin() as conn:
        for tool_name in tool_names:
            new = _new_operation(
                tool_name, request_id=None, position=0, needs_approval=False,
                approval_ttl=0.0, arguments=arguments,
            )
            _register(conn, new)
            reservation = store.reserve(conn, new.operation_id, store.new_owner_token(), TINY_LEASE)
            assert reservation is not None
            made.append((new.operation_id, reservation.generation))
    return made


def make_stale(db: Engine, tool_name: str, arguments: dict[str, Any] | None = None) -> tuple[str, int]:
    [made] = make_stale_many(db, [tool_name], arguments)
    return made


def wait_leases_expired(db: Engine) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with db.connect() as conn:
            live = conn.execute(
                select(func.count()).where(
                    operations.c.state == "started",
                    operations.c.lease_expires_at >= store.DATABASE_CLOCK.now(),
                )
            ).scalar_one()
        if live == 0:
            return
        time.sleep(TINY_LEASE)
    raise AssertionError("leases did not expire")


def wait_in_queue(db: Engine, *operation_ids: str) -> None:
    """As if these had waited in `queued` for twice the threshold (their message lost)."""
    with db.begin() as conn:
        conn.execute(
            update(operations)
            .where(operations.c.operation_id.in_(operation_ids))
            .values(queued_at=operations.c.queued_at - 2 * QUEUED_AFTER)
        )


def row(db: Engine, operation_id: str) -> Any:
    with db.connect() as conn:
        found = store.get_operation(conn, operation_id)
    assert found is not None
    return found


def trail(db: Engine, operation_id: str) -> list[Any]:
    with db.connect() as conn:
        return store.audit_trail(conn, operation_id)


def transitions_out_of(db: Engine, operation_id: str, generation: int) -> list[Any]:
    """Audit events that moved the operation out of `started` at `generation`."""
    return [
        e for e in trail(db, operation_id)
        if e.from_state == "started" and e.generation == generation
    ]


def outbox_rows(db: Engine, operation_id: str) -> int:
    with db.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(outbox.c.operation_id == operation_id)
            ).scalar_one()
        )


def receipt_rows(db: Engine, operation_id: str) -> list[Any]:
    with db.connect() as conn:
        return list(conn.execute(select(receipts).where(receipts.c.operation_id == operation_id)))


def done(receipt: str) -> Callable[[], LookupResult]:
    return lambda: LookupResult(LookupAnswer.DONE, Written(Out(receipt=receipt), receipt))


# ----------------------------------------------------------------- stale started


@pytest.mark.parametrize("tool_name", ["t.read", "t.idempotent", "t.fenced"])
def test_sweep__stale_takeover_safe_operation__requeued_once_with_a_fresh_message(
    db: Engine, reconciler: Reconciler, tool_name: str
) -> None:
    # Given an operation whose worker died while holding it
    operation_id, generation = make_stale(db, tool_name)
    wait_leases_expired(db)
    outbox_before = outbox_rows(db, operation_id)
    # When the reconciler sweeps
    report = reconciler.sweep()
    # Then it is queued again, with a new outbox row, audited as the reconciler's act
    op = row(db, operation_id)
    assert op.state == "queued"
    assert op.owner_token is None and op.lease_expires_at is None
    assert op.generation == generation  # the next reservation takes generation + 1
    assert outbox_rows(db, operation_id) == outbox_before + 1
    [event] = transitions_out_of(db, operation_id, generation)
    assert (event.to_state, event.decision_code, event.actor) == ("queued", "requeued_stale", "reconciler")
    assert report.actions == {"requeued_stale": 1}
    # And the next reservation fences the dead owner with a new generation
    with db.begin() as conn:
        again = store.reserve(conn, operation_id, store.new_owner_token(), 30)
    assert again is not None and again.generation == generation + 1


def test_sweep__live_lease__left_alone(db: Engine, reconciler: Reconciler) -> None:
    # Given operations whose owners are alive (long leases), one per contract
    live = []
    for tool_name in ["t.read", "t.fenced", "t.lookup", "t.unsafe"]:
        operation_id = register(db, tool_name)
        with db.begin() as conn:
            assert store.reserve(conn, operation_id, store.new_owner_token(), 60) is not None
        live.append(operation_id)
    # When the reconciler sweeps
    report = reconciler.sweep()
    # Then nothing changed and no downstream was asked
    assert report.total == 0
    for operation_id in live:
        assert row(db, operation_id).state == "started"
        assert len(trail(db, operation_id)) == 2  # admitted, reserved


def test_sweep__stale_lookup_done__recorded_as_succeeded_with_the_downstream_receipt(
    db: Engine, reconciler: Reconciler, downstream: Downstream
) -> None:
    # Given a lookup write whose worker died after the downstream accepted it
    operation_id, generation = make_stale(db, "t.lookup")
    downstream.answers[operation_id] = done("inv_123")
    wait_leases_expired(db)
    # When the reconciler sweeps
    report = reconciler.sweep()
    # Then the downstream's answer is the result: succeeded, receipt recorded by the reconciler
    op = row(db, operation_id)
    assert (op.state, op.receipt) == ("succeeded", "inv_123")
    assert json.loads(op.result)["output"] == {"receipt": "inv_123"}
    assert [(r.receipt, r.accepted, r.source, r.generation) for r in receipt_rows(db, operation_id)] == [
        ("inv_123", True, "reconciler", generation)
    ]
    [event] = transitions_out_of(db, operation_id, generation)
    assert (event.to_state, event.decision_code, event.actor) == ("succeeded", "lookup_done", "reconciler")
    assert outbox_rows(db, operation_id) == 1  # only the admission's: nothing runs it again
    assert report.actions == {"lookup_succeeded": 1}
    assert downstream.lookups == [operation_id]


def test_sweep__stale_lookup_not_done__requeued(
    db: Engine, reconciler: Reconciler, downstream: Downstream
) -> None:
    # Given a lookup write whose worker died before the downstream saw it
    operation_id, generation = make_stale(db, "t.lookup")
    wait_leases_expired(db)
    # When the reconciler sweeps and the downstream says it did not happen
    report = reconciler.sweep()
    # Then the operation runs again, under a new generation
    assert row(db, operation_id).state == "queued"
    assert outbox_rows(db, operation_id) == 2
    [event] = transitions_out_of(db, operation_id, generation)
    assert (event.to_state, event.actor) == ("queued", "reconciler")
    assert report.actions == {"lookup_requeued": 1}
    assert receipt_rows(db, operation_id) == []


def _raise_unavailable() -> LookupResult:
    raise RetryableError("ledger down")


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        pytest.param(lambda: LookupResult(LookupAnswer.UNKNOWN), "lookup_could_not_answer", id="unknown"),
        pytest.param(lambda: LookupResult(LookupAnswer.DONE, None), "lookup_could_not_answer",
                     id="done_without_receipt"),
        pytest.param(_raise_unavailable, "lookup_failed", id="raises"),
        pytest.param(lambda: LookupResult(LookupAnswer.DONE, Written({"bad": 1}, "r")), "lookup_failed",
                     id="invalid_output"),
    ],
)
def test_sweep__stale_lookup_cannot_answer__reconciliation_pending_not_retried(
    db: Engine, reconciler: Reconciler, downstream: Downstream,
    answer: Callable[[], LookupResult], reason: str,
) -> None:
    # Given a lookup write whose downstream cannot say whether it happened
    operation_id, generation = make_stale(db, "t.lookup")
    downstream.answers[operation_id] = answer
    wait_leases_expired(db)
    # When the reconciler sweeps
    report = reconciler.sweep()
    # Then a person decides: reconciliation_pending, no new message, audited
    op = row(db, operation_id)
    assert op.state == "reconciliation_pending"
    assert op.error_code == "reconciliation_pending"
    assert outbox_rows(db, operation_id) == 1
    [event] = transitions_out_of(db, operation_id, generation)
    assert (event.to_state, event.decision_code, event.actor) == (
        "reconciliation_pending", reason, "reconciler",
    )
    assert report.actions == {"marked_pending": 1}


def test_sweep__stale_unsafe_write__reconciliation_pending_never_requeued(
    db: Engine, reconciler: Reconciler, downstream: Downstream
) -> None:
    # Given an unsafe write whose worker died (its effect may or may not have happened)
    operation_id, generation = make_stale(db, "t.unsafe")
    wait_leases_expired(db)
    # When the reconciler sweeps, twice
    first = reconciler.sweep()
    second = reconciler.sweep()
    # Then it waits for a person, exactly one transition, never a new message
    op = row(db, operation_id)
    assert (op.state, op.generation, op.attempts) == ("reconciliation_pending", generation, 1)
    assert json.loads(op.error)["message"] == "outcome_unknown_after_lost_lease"
    assert outbox_rows(db, operation_id) == 1
    [event] = transitions_out_of(db, operation_id, generation)
    assert (event.to_state, event.decision_code, event.actor) == (
        "reconciliation_pending", "outcome_unknown_after_lost_lease", "reconciler",
    )
    assert first.actions == {"marked_pending": 1} and second.total == 0
    assert downstream.lookups == []  # an unsafe tool is never asked


def test_sweep__stale_operation_of_an_undeclared_tool__reconciliation_pending(
    db: Engine, reconciler: Reconciler
) -> None:
    # Given a stale operation whose tool is no longer declared
    operation_id, generation = make_stale(db, "t.removed")
    wait_leases_expired(db)
    # When the reconciler sweeps
    reconciler.sweep()
    # Then it is not guessed at: a person decides
    assert row(db, operation_id).state == "reconciliation_pending"
    [event] = transitions_out_of(db, operation_id, generation)
    assert event.decision_code == "tool_no_longer_declared"


def test_sweep__lookup_of_arguments_that_no_longer_validate__does_not_block_the_others(
    db: Engine, reconciler: Reconciler, downstream: Downstream
) -> None:
    # Given a stale lookup write whose stored arguments no longer fit the tool's model
    # (the schema changed since it was admitted), ahead of other stale work
    poisoned, _ = make_stale(db, "t.lookup", arguments={"account": "renamed"})
    wait_leases_expired(db)
    healthy, _ = make_stale(db, "t.lookup")
    downstream.answers[healthy] = done("inv_ok")
    unsafe, _ = make_stale(db, "t.unsafe")
    wait_leases_expired(db)
    # When the reconciler sweeps
    report = reconciler.sweep()
    # Then the sweep finishes: the poisoned one goes to a person, the rest are resolved
    assert row(db, poisoned).state == "reconciliation_pending"
    assert row(db, healthy).state == "succeeded"
    assert row(db, unsafe).state == "reconciliation_pending"
    assert report.actions == {"marked_pending": 2, "lookup_succeeded": 1}


def test_sweep__more_stale_operations_than_one_batch__all_resolved_in_one_sweep(
    db: Engine, settings: Settings, registry: Registry, downstream: Downstream
) -> None:
    # Given more stale operations than one batch holds, lookups among them
    reconciler = Reconciler(
        settings.with_(reconcile_batch_size=7, reconcile_queued_after_seconds=3600), db, registry
    )
    stale = [op for op, _ in make_stale_many(db, ["t.fenced", "t.lookup", "t.unsafe"] * 10)]
    for operation_id in stale[1::3]:
        downstream.answers[operation_id] = done(f"inv_{operation_id}")
    wait_leases_expired(db)
    # When the reconciler sweeps once (a cron run)
    report = reconciler.sweep()
    # Then none is left stale, and each was looked up once
    states = {row(db, operation_id).state for operation_id in stale}
    assert "started" not in states
    assert report.actions == {"requeued_stale": 10, "lookup_succeeded": 10, "marked_pending": 10}
    assert sorted(downstream.lookups) == sorted(stale[1::3])


# ----------------------------------------------------------------- queued, retries, approvals


def test_sweep__queued_longer_than_threshold__republished_once(
    db: Engine, reconciler: Reconciler
) -> None:
    # Given a queued operation whose message was lost, and a fresh one
    lost = register(db, "t.fenced")
    wait_in_queue(db, lost)
    fresh = register(db, "t.fenced")
    # When the reconciler sweeps twice in a row
    first = reconciler.sweep()
    second = reconciler.sweep()
    # Then the lost one gets one fresh message; the fresh one and the second sweep do nothing
    assert outbox_rows(db, lost) == 2
    assert outbox_rows(db, fresh) == 1
    assert row(db, lost).state == "queued"
    assert first.actions == {"republished_queued": 1}
    assert second.total == 0


def test_sweep__more_lost_messages_than_one_batch__all_republished_in_one_sweep(
    db: Engine, settings: Settings, registry: Registry
) -> None:
    # Given more queued operations with lost messages than one batch holds
    reconciler = Reconciler(settings.with_(reconcile_batch_size=3), db, registry)
    lost = [register(db, "t.fenced") for _ in range(8)]
    wait_in_queue(db, *lost)
    # When the reconciler sweeps once
    report = reconciler.sweep()
    # Then each got exactly one fresh message
    assert [outbox_rows(db, operation_id) for operation_id in lost] == [2] * 8
    assert report.actions == {"republished_queued": 8}


def test_sweep__queued_behind_an_unfinished_write__not_republished(
    db: Engine, reconciler: Reconciler
) -> None:
    # Given a request whose first write is running and second write is waiting for it
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    first = register(db, "t.fenced", request_id=request_id, position=0)
    with db.begin() as conn:
        assert store.reserve(conn, first, store.new_owner_token(), 60) is not None
    second = register(db, "t.fenced", request_id=request_id, position=1)
    wait_in_queue(db, second)
    # When the reconciler sweeps
    reconciler.sweep()
    # Then the waiting write is not republished (it has no message by design)
    assert outbox_rows(db, second) == 1


def test_sweep__two_reconcilers_interleaved_on_a_lost_message__republished_once(
    db: Engine, settings: Settings, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a queued operation whose message was lost
    lost = register(db, "t.fenced")
    wait_in_queue(db, lost)
    first, second = Reconciler(settings, db, registry), Reconciler(settings, db, registry)
    # When the first reconciler reads it as stale, then the second sweeps completely,
    # then the first goes on with what it read
    original = store.stale_queued
    reports: list[SweepReport] = []

    def read_then_let_the_other_sweep(*args: Any, **kwargs: Any) -> list[str]:
        found = original(*args, **kwargs)
        monkeypatch.setattr(store, "stale_queued", original)
        reports.append(second.sweep())
        return found

    monkeypatch.setattr(store, "stale_queued", read_then_let_the_other_sweep)
    reports.append(first.sweep())
    # Then exactly one of them republished it
    assert outbox_rows(db, lost) == 2
    assert sum(r.actions["republished_queued"] for r in reports) == 1


def test_sweep__retry_backoff_passed__promoted_to_queued(db: Engine, reconciler: Reconciler) -> None:
    # Given an operation released to retry with a backoff that has passed
    operation_id = register(db, "t.fenced")
    owner = store.new_owner_token()
    with db.begin() as conn:
        reservation = store.reserve(conn, operation_id, owner, 30)
        assert reservation is not None
        assert store.release_to_retry(
            conn, operation_id, reservation.generation, owner, delay_seconds=0.0,
            error_code=ErrorCode.UPSTREAM_UNAVAILABLE, error={"message": "down"},
        )
    # When the reconciler sweeps
    report = reconciler.sweep()
    # Then it is queued again with a fresh message
    assert row(db, operation_id).state == "queued"
    assert outbox_rows(db, operation_id) == 2
    assert report.actions == {"promoted_retry": 1}


def test_sweep__approval_expired__denied_by_the_reconciler(db: Engine, reconciler: Reconciler) -> None:
    # Given a call waiting for an approval that has expired
    operation_id = register(db, "t.fenced", needs_approval=True, approval_ttl=0.01)
    time.sleep(0.05)
    # When the reconciler sweeps
    report = reconciler.sweep()
    # Then the call ends failed_terminal (approval_denied), decided by the reconciler
    op = row(db, operation_id)
    assert (op.state, op.error_code) == ("failed_terminal", "approval_denied")
    with db.connect() as conn:
        approval = conn.execute(select(approvals).where(approvals.c.operation_id == operation_id)).one()
    assert (approval.state, approval.decided_by) == ("expired", "reconciler")
    assert report.actions == {"approval_expired": 1}


def test_sweep__empty_database__reports_nothing(reconciler: Reconciler) -> None:
    # Given an empty database, when the reconciler sweeps
    report = reconciler.sweep()
    # Then it did nothing and says so
    assert report.total == 0
    assert report.as_dict()["actions"] == {}


# ----------------------------------------------------------------- concurrency


def test_sweep__four_reconcilers_at_once__each_stale_operation_resolved_exactly_once(
    db: Engine, settings: Settings, registry: Registry, downstream: Downstream
) -> None:
    # Given 300 stale operations of every contract
    names = ["t.read", "t.idempotent", "t.fenced", "t.lookup", "t.lookup", "t.unsafe"]
    chosen = [names[i % len(names)] for i in range(300)]
    stale = make_stale_many(db, chosen)
    lookups = [op for name, op in zip(chosen, stale, strict=True) if name == "t.lookup"]
    for operation_id, _ in lookups[::2]:
        downstream.answers[operation_id] = done(f"inv_{operation_id}")
    wait_leases_expired(db)
    # When four reconcilers sweep at the same time (small batches, so they interleave)
    small = settings.with_(reconcile_batch_size=10, reconcile_queued_after_seconds=3600)
    reconcilers = [Reconciler(small, make_engine(settings.database_url), registry) for _ in range(4)]
    barrier = threading.Barrier(len(reconcilers))
    reports: list[SweepReport] = []
    errors: list[BaseException] = []

    def run(reconciler: Reconciler) -> None:
        barrier.wait()
        try:
            reports.append(reconciler.sweep())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in reconcilers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for r in reconcilers:
        r.engine.dispose()
    # Then no error, nothing left stale, and exactly one transition out of each stale generation
    assert errors == []
    for operation_id, generation in stale:
        assert len(transitions_out_of(db, operation_id, generation)) == 1, operation_id
        assert row(db, operation_id).state != "started"
    total = sum((r.actions for r in reports), start=Counter[str]())
    assert sum(total.values()) == len(stale)
    # And every lookup that found the effect recorded its receipt once
    for operation_id, _ in lookups[::2]:
        assert [r.source for r in receipt_rows(db, operation_id)] == ["reconciler"]


def test_sweep__new_owner_took_over_after_the_read__reconciler_cas_loses_and_changes_nothing(
    db: Engine, reconciler: Reconciler
) -> None:
    # Given a stale fenced operation that the reconciler has read as stale
    operation_id, generation = make_stale(db, "t.fenced")
    wait_leases_expired(db)
    with db.connect() as conn:
        [seen] = [s for s in store.stale_started(conn, 100) if s.operation_id == operation_id]
    # When a new owner takes it over before the reconciler acts on what it read
    with db.begin() as conn:
        taken = store.take_over(conn, operation_id, store.new_owner_token(), 30)
    assert taken is not None
    with db.begin() as conn:
        won = store.requeue_stale(conn, seen.operation_id, seen.generation)
    report = reconciler.sweep()
    # Then the reconciler's CAS on the generation it saw matches nothing
    assert not won and report.total == 0
    op = row(db, operation_id)
    assert (op.state, op.generation) == ("started", generation + 1)
    assert outbox_rows(db, operation_id) == 1


def test_reconciler_statements__repeated_on_a_settled_generation__all_lose_and_audit_unchanged(
    db: Engine,
) -> None:
    # Given a stale unsafe operation already resolved by one reconciler statement
    operation_id, generation = make_stale(db, "t.unsafe")
    wait_leases_expired(db)
    with db.begin() as conn:
        assert store.mark_unknown_expired(conn, operation_id, generation, reason="x")
    before = len(trail(db, operation_id))
    # When a second reconciler repeats each of its statements on the same generation
    with db.begin() as conn:
        results = [
            store.mark_unknown_expired(conn, operation_id, generation, reason="x"),
            store.requeue_stale(conn, operation_id, generation),
            store.record_lookup_result(conn, operation_id, generation, result={}, receipt="r"),
        ]
    # Then every one loses and the trail is unchanged
    assert results == [False, False, False]
    assert len(trail(db, operation_id)) == before
