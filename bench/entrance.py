"""The entrance: in-process `enqueue` against the plain INSERTs it stands in for.

    python -m bench.entrance [--requests 1000] [--rounds 3] [--write bench/ENTRANCE.md]

On the local PostgreSQL (`BENCH_PG`, default postgresql://postgres@127.0.0.1:5432),
in a database of its own, one producer thread, interleaved rounds, medians:

- **plain floor**: what an application writing its own outbox does per request, on
  psycopg directly: BEGIN, INSERT the operation, INSERT the outbox row, NOTIFY,
  COMMIT.
- **enqueue**: `outbox.producer.enqueue` of one no-op idempotent write
  (`bench.tools`' `bench.noop_write`) per request, in `engine.begin()`.
- **batch curve**: one `enqueue` of 1, 10 and 100 calls: cost per call.
- **round trips**: counted on the wire (libpq's trace: one ReadyForQuery per round
  trip) for one `enqueue` of 1, 10 and 100 calls, the caller's BEGIN excluded.

A bench, not a test: figures are printed and written, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg.pq import Trace
from sqlalchemy import Engine, create_engine, text

ROOT = Path(__file__).resolve().parents[1]
BASE = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
DATABASE = "toolfence_bench_entrance"


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
            enqueue(conn, batch, context, registry)
    return time.perf_counter() - started


def round_trips(engine: Engine, calls_per_request: int, prefix: str) -> int:
    from bench.tools import registry
    from executor.core.types import ProposedCall, ServerContext
    from outbox.producer import enqueue

    batch = [
        ProposedCall(call_id=f"c{k}", tool_name="bench.noop_write", arguments=json.dumps({"n": k}))
        for k in range(calls_per_request)
    ]
    context = ServerContext(principal="bench", tenant="bench", roles=frozenset({"member"}), request_id=prefix)
    with engine.begin() as conn:
        conn.execute(text("SELECT 1"))  # the caller's BEGIN is the caller's
        pgconn = conn.connection.driver_connection.pgconn  # type: ignore[union-attr]
        with tempfile.TemporaryFile("w+") as trace:
            pgconn.trace(trace.fileno())
            pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
            try:
                enqueue(conn, batch, context, registry)
            finally:
                pgconn.untrace()
            trace.seek(0)
            return sum(1 for line in trace if line.startswith("B\t") and "\tReadyForQuery" in line)


def median_rate(samples: list[float], per: int) -> float:
    return per / statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", default=str(ROOT / "bench" / "ENTRANCE.md"))
    args = parser.parse_args(argv)

    from executor.store.engine import make_engine
    from executor.store.migrate import migrate

    dsn = fresh_database()
    url = dsn.replace("postgresql://", "postgresql+psycopg://")
    migrate(url)
    engine = make_engine(url)
    load_before = os.getloadavg()
    # Warm both paths (connections, statement caches, imports).
    plain_floor(dsn, 50, "warm")
    enqueue_requests(engine, 50, "warm")

    samples: dict[str, list[float]] = {"floor": [], "enqueue": []}
    runs: list[tuple[str, Callable[[str], float]]] = [
        ("floor", lambda p: plain_floor(dsn, args.requests, p)),
        ("enqueue", lambda p: enqueue_requests(engine, args.requests, p)),
    ]
    for round_no in range(args.rounds):
        for name, run in runs if round_no % 2 == 0 else list(reversed(runs)):
            samples[name].append(run(f"{name}-{round_no}-{time.time_ns()}"))
            rate = args.requests / samples[name][-1]
            print(f"round {round_no + 1}: {name} {rate:.0f} requests/s", flush=True)

    curve: list[tuple[int, float, int]] = []
    for size in (1, 10, 100):
        requests = max(10, args.requests // size)
        seconds = [enqueue_requests(engine, requests, f"batch{size}-{r}-{time.time_ns()}", size)
                   for r in range(args.rounds)]
        curve.append((size, statistics.median(seconds) / (requests * size) * 1e6,
                      round_trips(engine, size, f"trips{size}-{time.time_ns()}")))
    engine.dispose()
    load_after = os.getloadavg()

    floor = median_rate(samples["floor"], args.requests)
    toolfence = median_rate(samples["enqueue"], args.requests)
    lines = [
        "# The entrance: in-process `enqueue` against plain INSERTs",
        "",
        f"Written by `python -m bench.entrance --requests {args.requests} --rounds {args.rounds}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. One producer thread, local PostgreSQL, "
        f"{args.rounds} interleaved rounds of {args.requests} one-call requests each, medians. "
        f"Load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        "(other work on the machine makes both rows slower, not their ratio fairer or less fair: "
        "they ran interleaved).",
        "",
        "| path | requests/s | ms/request | ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| plain floor: BEGIN, INSERT operation, INSERT outbox, NOTIFY, COMMIT (psycopg) "
        f"| {floor:.0f} | {1000 / floor:.2f} | 1.00 × |",
        f"| `enqueue`, one no-op idempotent write per request | {toolfence:.0f} | {1000 / toolfence:.2f} "
        f"| {toolfence / floor:.2f} × |",
        "",
        "Calls per `enqueue` (one request carrying many calls), cost per call and round trips "
        "of the `enqueue` (the caller's BEGIN and COMMIT not counted):",
        "",
        "| calls per request | µs per call | round trips |",
        "| ---: | ---: | ---: |",
        *(f"| {size} | {micros:.0f} | {trips} |" for size, micros, trips in curve),
        "",
        "Rounds (requests/s): "
        + "; ".join(f"{name} " + ", ".join(f"{args.requests / s:.0f}" for s in values)
                    for name, values in samples.items()),
        "",
    ]
    Path(args.write).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
