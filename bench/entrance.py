"""The entrance: in-process `enqueue` against the plain INSERTs it stands in for.

    python -m bench.entrance [--requests 1000] [--rounds 3] [--write bench/ENTRANCE.md]

On the local PostgreSQL (`BENCH_PG`, default postgresql://postgres@127.0.0.1:5432),
in a database of its own, one producer thread, interleaved rounds, medians:

- **plain floor**: what an application writing its own outbox does per request, on
  psycopg directly: BEGIN, INSERT the operation, INSERT the outbox row, NOTIFY,
  COMMIT.
- **enqueue**: `outbox.producer.enqueue` of one no-op idempotent write
  (`bench.tools`' `bench.noop_write`) per request, in `engine.begin()`.
- **calls per request**: one `enqueue` of 1, 10 and 100 calls: cost per call.
- **requests per `enqueue_many`**: 1, 10 and 100 one-call requests in one
  transaction: cost per call (= per request).
- **round trips**: counted on the wire (libpq's trace: one ReadyForQuery per round
  trip) for each size of both curves, the caller's BEGIN excluded.
- **HTTP** (`--http`, default on): `toolfence serve` as its own process on the same
  database, one client thread: `POST /v1/requests` of one call, and
  `POST /v1/request-batches` of 10 and 100 one-call requests: requests/s.

Every curve runs its sizes in interleaved rounds (the order reversed every other
round), medians.

A bench, not a test: figures are printed and written, never asserted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.pq import Trace
from sqlalchemy import Engine, create_engine, text

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1, 10, 100)
BASE = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
DATABASE = "toolfence_bench_entrance"


def _roomy() -> Any:
    from executor.core.budgets import BudgetLimits, Budgets

    # Budgets that admit every call: the curves measure admitted calls, not refusals
    # (the default request budget refuses a ninth call of one tool).
    room = BudgetLimits(max_calls=10_000, max_writes=10_000, max_calls_per_tool=10_000,
                        max_repeated_failures=10)
    return Budgets(request=room, conversation=room)


ROOMY = _roomy()


def fresh_database() -> str:
    admin = create_engine(f"{BASE.replace('postgresql://', 'postgresql+psycopg://')}/postgres",
                          isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        conn.execute(text(f"CREATE DATABASE {DATABASE}"))
    admin.dispose()
    return f"{BASE}/{DATABASE}"


def plain_floor(dsn: str, n: int, prefix: str) -> float:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS plain_operations (operation_id text PRIMARY KEY, "
            "request_id text NOT NULL, tool_name text NOT NULL, arguments text NOT NULL, "
            "state text NOT NULL, created_at double precision NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS plain_outbox (id bigserial PRIMARY KEY, "
            "operation_id text NOT NULL, created_at double precision NOT NULL)"
        )
        conn.commit()
        started = time.perf_counter()
        for i in range(n):
            with conn.transaction():
                conn.execute(
                    "INSERT INTO plain_operations VALUES (%s, %s, %s, %s, 'queued', "
                    "extract(epoch from clock_timestamp()))",
                    (f"{prefix}-{i}", f"{prefix}-{i}", "bench.noop_write", json.dumps({"n": i})),
                )
                conn.execute(
                    "INSERT INTO plain_outbox (operation_id, created_at) "
                    "VALUES (%s, extract(epoch from clock_timestamp()))",
                    (f"{prefix}-{i}",),
                )
                conn.execute("NOTIFY plain_outbox")
        return time.perf_counter() - started


def enqueue_requests(engine: Engine, n: int, prefix: str, calls_per_request: int = 1) -> float:
    from bench.tools import registry
    from executor.core.types import ProposedCall, ServerContext
    from outbox.producer import enqueue

    started = time.perf_counter()
    for i in range(n):
        batch = [
            ProposedCall(call_id=f"c{k}", tool_name="bench.noop_write", arguments=json.dumps({"n": k}))
            for k in range(calls_per_request)
        ]
        context = ServerContext(
            principal="bench", tenant="bench", roles=frozenset({"member"}), request_id=f"{prefix}-{i}"
        )
        with engine.begin() as conn:
            enqueue(conn, batch, context, registry, budgets=ROOMY)
    return time.perf_counter() - started


def queued(n: int, prefix: str, calls_per_request: int = 1) -> list[Any]:
    from executor.core.types import ProposedCall, ServerContext
    from outbox.batches import QueuedRequest

    return [
        QueuedRequest(
            [ProposedCall(call_id=f"c{k}", tool_name="bench.noop_write", arguments=json.dumps({"n": k}))
             for k in range(calls_per_request)],
            ServerContext(principal="bench", tenant="bench", roles=frozenset({"member"}),
                          request_id=f"{prefix}-{i}"),
        )
        for i in range(n)
    ]


def enqueue_many_requests(engine: Engine, n: int, prefix: str, per_batch: int) -> float:
    from bench.tools import registry
    from outbox.batches import enqueue_many

    items = queued(n, prefix)
    started = time.perf_counter()
    for first in range(0, n, per_batch):
        with engine.begin() as conn:
            enqueue_many(conn, items[first:first + per_batch], registry, budgets=ROOMY)
    return time.perf_counter() - started


def _traced(engine: Engine, run: Callable[[Any], object]) -> int:
    with engine.begin() as conn:
        conn.execute(text("SELECT 1"))  # the caller's BEGIN is the caller's
        pgconn = conn.connection.driver_connection.pgconn  # type: ignore[union-attr]
        with tempfile.TemporaryFile("w+") as trace:
            pgconn.trace(trace.fileno())
            pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
            try:
                run(conn)
            finally:
                pgconn.untrace()
            trace.seek(0)
            return sum(1 for line in trace if line.startswith("B\t") and "\tReadyForQuery" in line)


def many_round_trips(engine: Engine, per_batch: int, prefix: str) -> int:
    from bench.tools import registry
    from outbox.batches import enqueue_many

    items = queued(per_batch, prefix)
    return _traced(engine, lambda conn: enqueue_many(conn, items, registry, budgets=ROOMY))


def round_trips(engine: Engine, calls_per_request: int, prefix: str) -> int:
    from bench.tools import registry
    from executor.core.types import ProposedCall, ServerContext
    from outbox.producer import enqueue

    batch = [
        ProposedCall(call_id=f"c{k}", tool_name="bench.noop_write", arguments=json.dumps({"n": k}))
        for k in range(calls_per_request)
    ]
    context = ServerContext(principal="bench", tenant="bench", roles=frozenset({"member"}), request_id=prefix)
    return _traced(engine, lambda conn: enqueue(conn, batch, context, registry, budgets=ROOMY))


def median_rate(samples: list[float], per: int) -> float:
    return per / statistics.median(samples)


def per_call(samples: list[float], calls: int) -> float:
    """Median µs per call."""
    return statistics.median(samples) / calls * 1e6


def settle_statistics(dsn: str) -> None:
    """ANALYZE, as autovacuum would have by now on a live database: the bench grows its
    tables faster than autovacuum's one-minute nap, and a statement prepared while they
    were near-empty keeps a sequential scan's plan until an ANALYZE invalidates it
    (bench/run.py's `settle_statistics`; decision 0235). Never inside a timed run."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")


def interleaved(
    rounds: int, runs: dict[str, Callable[[str], float]], settle: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Each run once per round, the order reversed every other round: seconds each
    (`settle` before each run, outside its time)."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_no in range(rounds):
        for name in names if round_no % 2 == 0 else list(reversed(names)):
            if settle is not None:
                settle()
            samples[name].append(runs[name](f"{name}-{round_no}-{time.time_ns()}"))
            print(f"round {round_no + 1}: {name} {samples[name][-1]:.2f} s", flush=True)
    return samples


# ------------------------------------------------------------------ HTTP


def http_curve(url: str, requests: int, rounds: int) -> dict[int, float] | None:
    """`toolfence serve` on the bench database, one client: requests/s by requests per POST
    (1: POST /v1/requests; 10 and 100: POST /v1/request-batches). None if it cannot start."""
    import httpx

    from executor.http.keys import KeyScope, create_key
    from executor.store.engine import make_engine
    from tests.netkit import free_port

    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="toolfence-entrance-"))
    env = {
        **os.environ, "PYTHONUNBUFFERED": "1", "TOOLFENCE_DATABASE_URL": url,
        "TOOLFENCE_TOOLS": "bench.tools:registry", "TOOLFENCE_HOME": str(home),
        "TOOLFENCE_BROKER_URL": f"filesystem://{home / 'broker'}",
        "TOOLFENCE_HTTP_RATE_LIMIT": "100000000/minute",
        **{f"TOOLFENCE_BUDGET_{name}": "10000" for name in ("MAX_CALLS", "MAX_WRITES", "MAX_CALLS_PER_TOOL")},
    }
    log = (home / "serve.log").open("ab")
    server = subprocess.Popen(
        [sys.executable, "-m", "executor.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                print("toolfence serve did not start: no HTTP rows", flush=True)
                return None
            time.sleep(0.2)
        engine = make_engine(url)
        with engine.begin() as conn:
            key = create_key(conn, tenant="bench", principal="bench", roles=("member",),
                             scopes=(KeyScope.PRODUCE,))
        engine.dispose()
        call = {"call_id": "c0", "tool_name": "bench.noop_write", "arguments": {"n": 1}}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                          headers={"Authorization": f"Bearer {key}"}) as client:

            def post(per_post: int, count: int) -> float:
                started = time.perf_counter()
                for _ in range(0, count, per_post):
                    if per_post == 1:
                        answer = client.post("/v1/requests", json={"calls": [call]})
                    else:
                        answer = client.post("/v1/request-batches",
                                             json={"requests": [{"calls": [call]}] * per_post})
                    if answer.status_code != 202:
                        raise RuntimeError(f"{answer.status_code}: {answer.text[:300]}")
                return time.perf_counter() - started

            post(1, 50)
            post(10, 50)
            samples = interleaved(rounds, {
                f"http {size}": functools.partial(lambda size, _p: post(size, requests), size)
                for size in SIZES
            }, functools.partial(settle_statistics, url.replace("postgresql+psycopg://", "postgresql://")))
        return {size: median_rate(samples[f"http {size}"], requests) for size in SIZES}
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--http-requests", type=int, default=500)
    parser.add_argument("--no-http", dest="http", action="store_false")
    parser.add_argument("--write", default=str(ROOT / "bench" / "ENTRANCE.md"))
    args = parser.parse_args(argv)

    from executor.store.engine import make_engine
    from executor.store.migrate import migrate

    dsn = fresh_database()
    url = dsn.replace("postgresql://", "postgresql+psycopg://")
    migrate(url)
    engine = make_engine(url)
    load_before = os.getloadavg()
    # Warm every path (connections, statement caches, imports).
    plain_floor(dsn, 50, "warm")
    enqueue_requests(engine, 50, "warm")
    enqueue_many_requests(engine, 100, "warm-many", 10)

    n = args.requests
    settle = functools.partial(settle_statistics, dsn)
    samples = interleaved(args.rounds, {
        "floor": lambda p: plain_floor(dsn, n, p),
        "enqueue": lambda p: enqueue_requests(engine, n, p),
        "enqueue_many 100": lambda p: enqueue_many_requests(engine, n, p, 100),
    }, settle)
    calls_curve = interleaved(args.rounds, {
        f"calls {size}": functools.partial(
            lambda size, p: enqueue_requests(engine, max(10, n // size), p, size), size
        )
        for size in SIZES
    }, settle)
    many_curve = interleaved(args.rounds, {
        f"many {size}": functools.partial(lambda size, p: enqueue_many_requests(engine, n, p, size), size)
        for size in SIZES
    }, settle)
    trips = {size: round_trips(engine, size, f"trips{size}-{time.time_ns()}") for size in SIZES}
    many_trips = {size: many_round_trips(engine, size, f"mtrips{size}-{time.time_ns()}") for size in SIZES}
    engine.dispose()
    http = http_curve(url, args.http_requests, args.rounds) if args.http else None
    load_after = os.getloadavg()

    floor = median_rate(samples["floor"], n)
    single = median_rate(samples["enqueue"], n)
    many = median_rate(samples["enqueue_many 100"], n)
    lines = [
        "# The entrance: in-process `enqueue` against plain INSERTs",
        "",
        f"Written by `python -m bench.entrance --requests {n} --rounds {args.rounds}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. One producer thread, local PostgreSQL, "
        f"{args.rounds} interleaved rounds of {n} one-call requests each, medians. "
        f"Load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        "(other work on the machine makes every row slower, not their ratio fairer or less fair: "
        "they ran interleaved). Every call is admitted (budgets that admit them all).",
        "",
        "| path | requests/s | ms/request | ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| plain floor: BEGIN, INSERT operation, INSERT outbox, NOTIFY, COMMIT (psycopg) "
        f"| {floor:.0f} | {1000 / floor:.2f} | 1.00 × |",
        f"| `enqueue`, one no-op idempotent write per request | {single:.0f} | {1000 / single:.2f} "
        f"| {single / floor:.2f} × |",
        f"| `enqueue_many`, 100 such requests per transaction | {many:.0f} | {1000 / many:.2f} "
        f"| {many / floor:.2f} × |",
        "",
        "Calls per `enqueue` (one request carrying many calls; a write after the request's "
        "first waits for it, so only the first gets an outbox row), cost per call and round "
        "trips of the `enqueue` (the caller's BEGIN and COMMIT not counted):",
        "",
        "| calls per request | µs per call | round trips |",
        "| ---: | ---: | ---: |",
        *(f"| {size} | {per_call(calls_curve[f'calls {size}'], max(10, n // size) * size):.0f} "
          f"| {trips[size]} |" for size in SIZES),
        "",
        "Requests per `enqueue_many` (one-call requests, one transaction each call; the "
        "transaction's BEGIN and COMMIT counted in the cost, not in the round trips):",
        "",
        "| requests per transaction | µs per call | round trips |",
        "| ---: | ---: | ---: |",
        *(f"| {size} | {per_call(many_curve[f'many {size}'], n):.0f} | {many_trips[size]} |"
          for size in SIZES),
        "",
    ]
    if http is not None:
        lines += [
            f"`toolfence serve` (one process, its own), one client thread, {args.http_requests} one-call "
            "requests per round: `POST /v1/requests` one at a time, and `POST /v1/request-batches` "
            "of 10 and 100:",
            "",
            "| requests per POST | requests/s | ms/request |",
            "| ---: | ---: | ---: |",
            *(f"| {size} | {rate:.0f} | {1000 / rate:.2f} |" for size, rate in http.items()),
            "",
        ]
    lines += [
        "Rounds (requests/s): "
        + "; ".join(f"{name} " + ", ".join(f"{n / s:.0f}" for s in values)
                    for name, values in samples.items()),
        "",
    ]
    Path(args.write).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
