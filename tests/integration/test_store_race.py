"""Racing reservations on real PostgreSQL: one winner per (operation, generation).

Contenders (threads with their own connection, then processes with their own
engine) start each round together at a barrier and try every operation. Round 0
reserves (queued → started); every later round happens after the previous leases
have expired on the shared `ManualClock` timeline and tries `take_over`. Whatever
the interleaving, each operation must get exactly one owner per generation and
its generations must be 1, 2, 3, … without a gap.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import queue
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine

from executor import store
from executor.core.states import is_legal
from executor.store import Created, NewOperation
from executor.store.clock import ManualClock
from executor.store.engine import make_engine

pytestmark = pytest.mark.postgres

OPERATIONS = 60
ROUNDS = 4  # one reservation + three rounds of lease expiry and take-over
START = 1_000_000.0
ROUND_SECONDS = 100.0
LEASE = 50.0  # expires before the next round's clock

Win = tuple[str, int, str, int]  # (operation_id, generation, owner_token, round)


def register_operations(engine: Engine, prefix: str) -> list[str]:
    operation_ids = [f"{prefix}-{i:03d}" for i in range(OPERATIONS)]
    clock = ManualClock(START)
    with engine.begin() as conn:
        for i, operation_id in enumerate(operation_ids):
            created = store.register(
                conn,
                NewOperation(
                    operation_id=operation_id,
                    request_id=operation_id,  # one request each: no ordering between them
                    call_id="call-0",
                    position=0,
                    tool_name="charge",
                    schema_version=1,
                    mode="write",
                    intent_hash=hashlib.sha256(f"charge {i}".encode()).hexdigest(),
                    arguments={"i": i},
                    context={"principal": "p", "tenant": "t", "roles": [], "request_id": "r"},
                    needs_approval=False,
                    impact=None,
                ),
                clock=clock,
            )
            assert isinstance(created, Created)
    return operation_ids


def contend(
    engine: Engine,
    name: str,
    operation_ids: list[str],
    wait_for_others: Callable[[], Any],
) -> list[Win]:
    """One contender: every round, try to own every operation, in its own order."""
    order = list(operation_ids)
    random.Random(name).shuffle(order)
    wins: list[Win] = []
    with engine.connect() as conn:
        for round_number in range(ROUNDS):
            clock = ManualClock(START + round_number * ROUND_SECONDS)
            attempt = store.reserve if round_number == 0 else store.take_over
            wait_for_others()
            for operation_id in order:
                token = f"{name}-r{round_number}-{operation_id}"
                with conn.begin():
                    won = attempt(conn, operation_id, token, LEASE, clock=clock)
                if won is not None:
                    assert won.owner_token == token
                    wins.append((operation_id, won.generation, token, round_number))
    return wins


def assert_one_winner_per_generation(engine: Engine, operation_ids: list[str], wins: list[Win]) -> None:
    winners = Counter((operation_id, generation) for operation_id, generation, _, _ in wins)
    doubles = {key: count for key, count in winners.items() if count > 1}
    assert doubles == {}, f"two owners of one generation: {doubles}"
    per_round = Counter((operation_id, round_number) for operation_id, _, _, round_number in wins)
    assert per_round == {(op, r): 1 for op in operation_ids for r in range(ROUNDS)}

    generations: dict[str, list[int]] = defaultdict(list)
    for operation_id, generation, _, _ in wins:
        generations[operation_id].append(generation)
    expected = list(range(1, ROUNDS + 1))
    assert {op: sorted(gens) for op, gens in generations.items()} == {
        op: expected for op in operation_ids
    }

    # The database agrees: the last winner owns the last generation, and the audit
    # trail has one legal event per handed-out generation.
    last_owner = {op: token for op, generation, token, _ in wins if generation == ROUNDS}
    with engine.connect() as conn:
        for operation_id in operation_ids:
            row = store.get_operation(conn, operation_id)
            assert row is not None
            assert (row.state, row.generation, row.owner_token) == (
                "started", ROUNDS, last_owner[operation_id],
            )
            events = store.audit_trail(conn, operation_id)
            assert [e.generation for e in events] == [0, *expected]
            assert all(is_legal(e.from_state, e.to_state) for e in events)


def test_reserve_and_take_over__8_threads_racing__one_winner_per_generation(
    pg_engine: Engine,
) -> None:
    # Given 60 queued operations and 8 contenders, each with its own connection
    operation_ids = register_operations(pg_engine, "thr")
    contenders = 8
    barrier = threading.Barrier(contenders, timeout=60)
    results: dict[str, list[Win]] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            results[name] = contend(pg_engine, name, operation_ids, barrier.wait)
        except BaseException as exc:  # surfaced below; a dead thread must not hang the barrier
            errors.append(exc)
            barrier.abort()

    # When they race through a reservation and three rounds of expiry and take-over
    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(results) == contenders

    # Then every (operation, generation) had exactly one winner, generations contiguous
    wins = [win for found in results.values() for win in found]
    assert_one_winner_per_generation(pg_engine, operation_ids, wins)
    # And the wins were spread: this was a race, not one thread doing everything.
    assert sum(1 for found in results.values() if found) > 1


def _contend_in_process(
    url: str, name: str, operation_ids: list[str], barrier: Any, out: Any
) -> None:
    engine = make_engine(url)
    try:
        out.put((name, contend(engine, name, operation_ids, barrier.wait), None))
    except BaseException as exc:
        barrier.abort()
        out.put((name, [], repr(exc)))
    finally:
        engine.dispose()


def test_reserve_and_take_over__processes_racing__one_winner_per_generation(
    pg_url: str, pg_engine: Engine
) -> None:
    # Given 60 queued operations and 3 processes (spawned: nothing shared but the database)
    operation_ids = register_operations(pg_engine, "proc")
    context = multiprocessing.get_context("spawn")
    processes_count = 3
    barrier = context.Barrier(processes_count, timeout=120)
    out = context.Queue()
    processes = [
        context.Process(
            target=_contend_in_process, args=(pg_url, f"p{i}", operation_ids, barrier, out)
        )
        for i in range(processes_count)
    ]
    # When they race
    for process in processes:
        process.start()
    try:
        reports = [out.get(timeout=180) for _ in processes]
    except queue.Empty:  # pragma: no cover - reported as a failure below
        reports = []
    for process in processes:
        process.join(timeout=30)
        if process.is_alive():  # pragma: no cover
            process.kill()
    assert len(reports) == processes_count, "a contender process did not report"
    assert [error for _, _, error in reports if error] == []
    assert all(process.exitcode == 0 for process in processes)

    # Then exactly one winner per (operation, generation), generations contiguous
    wins = [win for _, found, _ in reports for win in found]
    assert_one_winner_per_generation(pg_engine, operation_ids, wins)
