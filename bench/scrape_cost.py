"""What one exporter scrape costs on PostgreSQL, by size of the operations table.

For each size it creates a scratch database, migrates it, fills it with
`INSERT … SELECT generate_series` (a million operations in about a minute),
VACUUM ANALYZEs it (the steady state autovacuum keeps), then times
`executor.telemetry.exporter.scrape` — every database gauge a scrape reads (the
invariant passes run on their own thread, not in the scrape: bench/check_cost.py
measures them) — and, for comparison, the same gauges computed over the whole
history (what the exporter does NOT do).

The shape of the data does not change with size: `--active` operations in
non-terminal states and `--recent` rows within the invariant window; everything
else is terminal history with one accepted receipt, one call row and one
published outbox row per operation. So a bounded scrape should cost the same at
every size, and the full-history one should grow with it.

    .venv/bin/python bench/scrape_cost.py                       # 10k and 1M
    .venv/bin/python bench/scrape_cost.py --sizes 1000000 --active 100000 --explain
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from sqlalchemy import Connection, Engine, event, select, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor.store.clock import db_now
from executor.store.invariant_check import check
from executor.store.invariant_watch import InvariantWatch
from executor.store.migrate import migrate
from executor.telemetry.exporter import (
    ExporterConfig,
    active_operations,
    make_scrape_engine,
    scrape,
)

FILL = """
WITH params AS (
  SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION) AS now
), rows AS (
  SELECT g,
         -- the last :recent rows lie inside the invariant window, the rest far before it
         CASE WHEN g > :n - :recent
              THEN p.now - (:n - g + 1) * (:window * 0.9 / :recent)
              ELSE p.now - 2 * :window - (:n - :recent - g) END AS created_at,
         CASE WHEN g > :n - :active THEN
                (ARRAY['queued','started','retry_wait','reconciliation_pending',
                       'pending_approval'])[1 + g % 5]
              WHEN g % 10 = 0 THEN 'failed_terminal'
              ELSE 'succeeded' END AS state,
         p.now
  FROM generate_series(1, :n) AS g, params p
)
INSERT INTO toolfence_operations (
  operation_id, request_id, call_id, position, tool_name, schema_version, mode, state,
  generation, owner_token, lease_expires_at, intent_hash, arguments, context, attempts,
  available_at, queued_at, result, receipt, error_code, created_at, updated_at, started_at,
  finished_at)
SELECT 'op-' || g, 'req-' || g, 'call-' || g, 0,
       (ARRAY['ledger.refund','ledger.lookup','ledger.transfer'])[1 + g % 3], 1, 'write', state,
       CASE WHEN state IN ('pending_approval','queued') THEN 0 ELSE 1 END,
       CASE WHEN state = 'started' THEN md5(g::text) END,
       CASE WHEN state = 'started' THEN now + 10 END,
       md5('intent' || g), '{"amount":1}', '{"tenant":"t1","principal":"p1"}',
       CASE WHEN state IN ('pending_approval','queued') THEN 0 ELSE 1 END,
       CASE WHEN state = 'retry_wait' THEN now + 30
            WHEN state = 'queued' THEN now - g % 60 ELSE created_at END,
       CASE WHEN state <> 'pending_approval' THEN created_at END,
       CASE WHEN state = 'succeeded' THEN '{"ok":true}' END,
       CASE WHEN state = 'succeeded' THEN 'rcpt-' || g END,
       CASE WHEN state = 'failed_terminal' THEN 'execution_failed' END,
       created_at,
       created_at + 0.5,
       CASE WHEN state IN ('started','succeeded','failed_terminal','retry_wait',
                           'reconciliation_pending') THEN created_at + 0.1 END,
       CASE WHEN state IN ('succeeded','failed_terminal') THEN created_at + 0.5 END
FROM rows
"""

DERIVED = [
    # One accepted receipt per succeeded operation, recorded when it finished.
    """
    INSERT INTO toolfence_receipts (operation_id, generation, receipt, accepted, source,
                                    recorded_at)
    SELECT operation_id, generation, receipt, true, 'worker', finished_at
    FROM toolfence_operations WHERE state = 'succeeded'
    """,
    # One call row per operation, admitted (its result comes from the operation).
    """
    INSERT INTO toolfence_calls (request_id, call_id, position, tool_name, operation_id,
                                 created_at)
    SELECT request_id, call_id, position, tool_name, operation_id, created_at
    FROM toolfence_operations
    """,
    # One outbox row per operation; queued ones not yet published.
    """
    INSERT INTO toolfence_outbox (operation_id, created_at, published_at, attempts,
                                  next_attempt_at)
    SELECT operation_id, created_at,
           CASE WHEN state = 'queued' THEN NULL ELSE created_at + 0.01 END, 1, created_at
    FROM toolfence_operations WHERE state <> 'pending_approval'
    """,
    """
    INSERT INTO toolfence_approvals (approval_id, operation_id, intent_hash, impact, state,
                                     requested_at, expires_at)
    SELECT 'apr-' || operation_id, operation_id, intent_hash, '{}', 'pending', created_at,
           created_at + 86400
    FROM toolfence_operations WHERE state = 'pending_approval'
    """,
]


def _url(admin_dsn: str, dbname: str) -> str:
    base = admin_dsn.rsplit("/", 1)[0]
    return f"{base}/{dbname}".replace("postgresql://", "postgresql+psycopg://", 1)


def create_filled(admin_dsn: str, size: int, active: int, recent: int, window: float) -> str:
    dbname = f"toolfence_bench_scrape_{size}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{dbname}"')
    url = _url(admin_dsn, dbname)
    migrate(url)
    started = time.perf_counter()
    params = {"n": size, "active": min(active, size), "recent": min(recent, size), "window": window}
    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        fill = FILL
        for key, value in params.items():
            # Plain integers and a float, formatted here: generate_series needs them as literals.
            fill = fill.replace(f":{key}", repr(value))
        conn.execute(fill)
        for statement in DERIVED:
            conn.execute(statement)
        conn.execute("VACUUM ANALYZE")
    print(f"  filled {size:,} operations in {time.perf_counter() - started:.1f}s", flush=True)
    return url


def timed(function: Callable[[], object], repeat: int) -> list[float]:
    function()  # warm: connection, catalog caches, plan
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return samples


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return (
        f"median {statistics.median(ordered) * 1000:8.2f} ms   p95 {p95 * 1000:8.2f} ms   "
        f"max {ordered[-1] * 1000:8.2f} ms"
    )


def full_history_queries(engine: Engine) -> dict[str, Callable[[], object]]:
    """The unbounded alternatives: every state counted, the invariants over all rows
    (`toolfence check --all`; bench/check_cost.py measures the command itself)."""

    def run(query: Callable[[Connection, float], object]) -> Callable[[], object]:
        def timed_query() -> object:
            with engine.connect() as conn, conn.begin():
                now = float(conn.execute(select(db_now())).scalar_one())
                return query(conn, now)

        return timed_query

    return {
        "count by state, all states": run(lambda conn, _now: conn.execute(text(
            "SELECT state, count(*) FROM toolfence_operations GROUP BY state")).all()),
        "I1-I7 over all history": run(lambda conn, now: check(
            conn, since=None, stuck_after_seconds=ExporterConfig().stuck_after_seconds, now=now)),
    }


def explain(conn: Connection, config: ExporterConfig) -> None:
    """Print the plans of the queries that touch the large tables: which index each uses."""
    now = float(conn.execute(select(db_now())).scalar_one())
    captured: list[str] = []

    def capture(_conn: Connection, _cursor: object, statement: str, params: object, *_: object) -> None:
        if isinstance(params, dict):
            for key, value in params.items():
                # An array parameter (`= ANY`, the chunk reads) as an ARRAY literal.
                shown = f"ARRAY[{', '.join(map(repr, value))}]" if isinstance(value, list) else repr(value)
                statement = statement.replace(f"%({key})s", shown)
        captured.append(statement)

    event.listen(conn, "before_cursor_execute", capture)
    try:
        active_operations(conn)
        # The first invariant pass of an exporter: its whole window (bench/check_cost.py
        # measures the passes themselves).
        InvariantWatch(config.invariant_window_seconds).run(conn, now=now)
    finally:
        event.remove(conn, "before_cursor_execute", capture)
    for statement in captured:
        plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement).scalars().all()
        print("   ", " ".join(statement.split())[:110])
        for line in plan:
            print("      ", line)


def run_size(args: argparse.Namespace, size: int, config: ExporterConfig) -> None:
    active, recent = min(args.active, size), min(args.recent, size)
    print(f"operations: {size:,} (active {active:,}, recent {recent:,})", flush=True)
    url = create_filled(args.admin_dsn, size, active, recent, config.invariant_window_seconds)
    engine = make_scrape_engine(url, config)
    try:
        snapshot = scrape(engine, config)
        print(
            f"  gauges: active={dict(snapshot.operations_active)} "
            f"backlog={snapshot.outbox_backlog} stuck={dict(snapshot.operations_stuck)}"
        )
        bounded = timed(lambda: scrape(engine, config), args.repeat)
        print(f"  exporter scrape (bounded):   {summary(bounded)}")
        print("  what the exporter does not do, for comparison:")
        for name, query in full_history_queries(engine).items():
            print(f"    {name:28} {summary(timed(query, max(3, args.repeat // 10)))}")
        if args.explain:
            with engine.connect() as conn:
                explain(conn, config)
    finally:
        engine.dispose()
        if not args.keep:
            with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "toolfence_bench_scrape_{size}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--admin-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--active", type=int, default=1000, help="non-terminal operations")
    parser.add_argument("--recent", type=int, default=2000, help="rows inside the window")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the scratch databases")
    args = parser.parse_args()
    config = ExporterConfig()
    for size in (int(s) for s in args.sizes.split(",")):
        run_size(args, size, config)


if __name__ == "__main__":
    main()
