"""`enqueue_many`: many requests in one transaction, each admitted as `enqueue`
admits it, in two round trips on PostgreSQL whatever the number of requests.

Round trips are counted on the wire as in test_intake_round_trips.py (libpq's
trace, one ReadyForQuery per round trip). The answers are compared with the same
requests enqueued one by one (another tenant, same database): budgets, repeats,
ordering and idempotency are each request's own, and a later request of a
conversation sees what an earlier one of the batch decided.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from executor.core.budgets import BudgetLimits, Budgets
from executor.core.identifiers import InvalidIdentifier
from executor.core.types import ServerContext
from executor.store.schema import calls, operations, outbox
from outbox.batches import QueuedRequest, enqueue_many
from outbox.producer import EnqueueHandle, InvalidBatch, enqueue
from tests.integration.test_intake_round_trips import REGISTRY, note, round_trips


def ctx(request_id: str, conversation_id: str | None = None, tenant: str = "acme") -> ServerContext:
    return ServerContext(
        principal="alice", tenant=tenant, roles=frozenset({"member"}), request_id=request_id,
        conversation_id=conversation_id,
    )


def summary(handles: Sequence[EnqueueHandle]) -> list[list[tuple[str, str, Any, Any]]]:
    """What a caller learns of each call, without the tenant-named operation ids."""
    out = []
    for handle in handles:
        rows = []
        for c in handle.calls:
            status = c.status
            error = getattr(status, "error", None)
            rows.append((c.call_id, status.status, getattr(error, "code", None),
                         getattr(status, "reused_from_call_id", None)))
        out.append(rows)
    return out


LIMITS = {"max_calls": 4, "max_writes": 10, "max_calls_per_tool": 10, "max_repeated_failures": 10}
BUDGETS = Budgets(request=BudgetLimits(**LIMITS), conversation=BudgetLimits(**LIMITS))


_ROOM = BudgetLimits(max_calls=1000, max_writes=1000, max_calls_per_tool=1000, max_repeated_failures=10)
ROOMY = Budgets(request=_ROOM, conversation=_ROOM)


def mixed(tenant: str) -> list[QueuedRequest]:
    return [
        QueuedRequest([note("c1", "notes.add", "x"), note("c2", "notes.read", "a")],
                      ctx("r1", "conv", tenant)),
        # repeats r1's write in the conversation: answered from r1's call
        QueuedRequest([note("c1", "notes.add", "x"), note("bad\x00id", "notes.read", "b")],
                      ctx("r2", "conv", tenant)),
        # the conversation's budget (4 counted calls) is spent after r1 and r2
        QueuedRequest([note("c1", "notes.read", "c")], ctx("r3", "conv", tenant)),
        QueuedRequest([note("c1", "notes.add", "x"), note("c2", "notes.unknown", "d"),
                       note("c3", "notes.add", "y")], ctx("r4", None, tenant)),
    ]


def test_a_batch__answers_as_the_same_requests_enqueued_one_by_one(engine: Engine) -> None:
    with engine.begin() as conn:
        together = enqueue_many(conn, mixed("batch"), REGISTRY, budgets=BUDGETS)
    with engine.begin() as conn:
        apart = [enqueue(conn, r.calls, r.context, REGISTRY, budgets=BUDGETS) for r in mixed("apart")]
    assert summary(together) == summary(apart)
    assert [h.request_id for h in together] == ["r1", "r2", "r3", "r4"]
    assert summary(together)[1][0][3] == "c1"  # reused across the batch's requests
    assert summary(together)[2][0][2] == "call_budget_exceeded"
    # And enqueued again, every call answers from what is recorded, and nothing is added
    with engine.connect() as conn:
        before = conn.execute(select(func.count()).select_from(calls)).scalar_one()
    with engine.begin() as conn:
        again = enqueue_many(conn, mixed("batch"), REGISTRY, budgets=BUDGETS)
    with engine.connect() as conn:
        after = conn.execute(select(func.count()).select_from(calls)).scalar_one()
    assert (summary(again), after) == (summary(together), before)


def test_tuples_and_no_requests(engine: Engine) -> None:
    with engine.begin() as conn:
        assert enqueue_many(conn, [], REGISTRY) == []
        [handle] = enqueue_many(conn, [([note("c1", "notes.read", "a")], ctx("r1"))], REGISTRY)
    assert handle.calls[0].status.status == "pending"


@pytest.mark.parametrize("bad", [
    QueuedRequest([note("c1", "notes.read", "a")], ctx("r\x00")),  # a bad request id
    QueuedRequest([note("c1", "notes.read", "a"), note("c1", "notes.read", "b")], ctx("r9")),
    QueuedRequest([note("c1", "notes.read", "a")], ctx("r1")),  # r1 twice
])
def test_a_bad_request__refuses_the_batch_and_writes_nothing(engine: Engine, bad: QueuedRequest) -> None:
    good = [QueuedRequest([note("c1", "notes.read", "a")], ctx("r1")),
            QueuedRequest([note("c1", "notes.add", "b")], ctx("r2"))]
    with pytest.raises((InvalidIdentifier, InvalidBatch)) as raised, engine.begin() as conn:
        enqueue_many(conn, [*good, bad], REGISTRY)
    assert raised.value.request_index == 2
    with engine.connect() as conn:
        for table in (calls, operations, outbox):
            assert conn.execute(select(func.count()).select_from(table)).scalar_one() == 0


@pytest.mark.parametrize(("requests", "calls_each"), [(1, 1), (10, 1), (100, 1), (10, 10)])
def test_postgresql__two_round_trips_whatever_the_number_of_requests(
    pg_engine: Engine, requests: int, calls_each: int
) -> None:
    batch = [
        QueuedRequest([note(f"c{k}", "notes.add", f"{i}-{k}") for k in range(calls_each)],
                      ctx(f"r{i}", f"conv{i % 3}"))
        for i in range(requests)
    ]
    with pg_engine.begin() as conn:
        conn.execute(text("SELECT 1"))  # the caller's BEGIN is the caller's
        with round_trips(conn) as counted:
            handles = enqueue_many(conn, batch, REGISTRY, budgets=ROOMY)
    assert counted == [2]
    assert all(c.status.status == "pending" for h in handles for c in h.calls)
    with pg_engine.connect() as conn:
        ops = conn.execute(select(func.count()).select_from(operations)).scalar_one()
        assert ops == requests * calls_each
        # a write waiting for the request's earlier write gets its message when that one settles
        assert conn.execute(select(func.count()).select_from(outbox)).scalar_one() == requests


def test_postgresql__concurrent_batches_crossing_conversations__no_deadlock_budgets_hold(
    pg_engine: Engine,
) -> None:
    # Two producers, each a batch of requests in conversations X and Y in opposite
    # orders, plus one-request producers: the locks are taken in one order by all.
    limits = {"max_calls": 5, "max_writes": 100, "max_calls_per_tool": 100, "max_repeated_failures": 10}
    budgets = Budgets(request=BudgetLimits(**limits), conversation=BudgetLimits(**limits))
    errors: list[BaseException] = []

    def producer(name: str, conversations: list[str]) -> None:
        try:
            for round_no in range(6):
                batch = [
                    QueuedRequest([note("c1", "notes.read", name), note("c2", "notes.read", name)],
                                  ctx(f"{name}-{round_no}-{conv}", conv))
                    for conv in conversations
                ]
                with pg_engine.begin() as conn:
                    if len(batch) == 1:
                        enqueue(conn, batch[0].calls, batch[0].context, REGISTRY, budgets=budgets)
                    else:
                        enqueue_many(conn, batch, REGISTRY, budgets=budgets)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=producer, args=("p1", ["X", "Y"])),
        threading.Thread(target=producer, args=("p2", ["Y", "X"])),
        threading.Thread(target=producer, args=("p3", ["X"])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    with pg_engine.connect() as conn:
        counted = dict(conn.execute(
            select(calls.c.conversation_id, func.count())
            .where(calls.c.gate.is_(None)).group_by(calls.c.conversation_id)
        ).all())
    assert counted == {"X": 5, "Y": 5}


def test_postgresql__a_listener_is_woken_once_the_batch_commits_not_before(
    pg_engine: Engine, pg_url: str
) -> None:
    # NOTIFY rides on the outbox rows' statement: delivered at commit, as before
    import psycopg

    from outbox.producer import NOTIFY_CHANNEL

    dsn = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        with pg_engine.begin() as conn:
            enqueue_many(conn, [QueuedRequest([note("c1", "notes.add", "x")], ctx("r1"))], REGISTRY)
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []
        [woken] = list(listener.notifies(timeout=5, stop_after=1))
    assert woken.channel == NOTIFY_CHANNEL


def test_postgresql__a_chosen_id_taken_mid_batch__raced_and_nothing_of_the_batch_stands(pg_url: str) -> None:
    from executor import store
    from executor.core.tools import Access, Approval, Effect, Mode, Registry, Tool
    from executor.store.engine import make_engine
    from outbox.producer import AdmissionUnavailable
    from tests.integration.test_intake_round_trips import Done, Note, _write

    other, engine = make_engine(pg_url), make_engine(pg_url)
    taken: list[str] = []

    def rule(args: Note, context: ServerContext) -> bool:
        # Between the batch's reads and its writes, another request registers the
        # id the batch's second request chose, and commits.
        if context.request_id == "r2" and not taken:
            taken.append("op-chosen")
            with other.begin() as conn:
                enqueue(conn, [note("x1", "race.add", "theirs")], ctx("r-other"), race,
                        operation_ids={"x1": "op-chosen"})
        return True

    race = Registry([Tool(
        name="race.add", description="add", mode=Mode.WRITE, untrusted_output=False, input_model=Note,
        output_model=Done, run=_write, access=Access.for_roles("member", rule=rule),
        approval=Approval.never(), effect=[Effect.IDEMPOTENT],
    )])
    batch = [
        QueuedRequest([note("c1", "race.add", "a")], ctx("r1")),
        QueuedRequest([note("c1", "race.add", "b")], ctx("r2"), operation_ids={"c1": "op-chosen"}),
        QueuedRequest([note("c1", "race.add", "c")], ctx("r3")),
    ]
    try:
        with pytest.raises(AdmissionUnavailable) as raised, engine.begin() as conn:
            enqueue_many(conn, batch, race)
        assert isinstance(raised.value, store.AdmissionRaced)
        with engine.connect() as conn:
            ours = select(func.count()).select_from(calls).where(calls.c.request_id != "r-other")
            assert conn.execute(ours).scalar_one() == 0
            assert conn.execute(select(func.count()).select_from(operations)).scalar_one() == 1  # theirs
    finally:
        engine.dispose()
        other.dispose()


def test_more_requests_than_the_cap__refused_before_the_database(engine: Engine) -> None:
    from outbox.batches import MAX_REQUESTS

    batch = [QueuedRequest([note("c1", "notes.read", "a")], ctx(f"r{i}")) for i in range(MAX_REQUESTS + 1)]
    with pytest.raises(InvalidBatch) as raised, engine.begin() as conn:
        enqueue_many(conn, batch, REGISTRY)
    assert raised.value.code == "too_many_requests"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(calls)).scalar_one() == 0
