"""What `toolfence check` costs on PostgreSQL with a million operations: seconds and peak memory.

Fills a scratch database the way bench/scrape_cost.py does (`INSERT … SELECT
generate_series`: terminal history with one accepted receipt, one call row and
one outbox row per operation, `--active` operations in flight, `--recent` ones
inside the last day), adds each operation's audit trail (2–3 events, as the
store writes them), VACUUM ANALYZEs it, then runs the command as an operator
would, a process per run, for the default window (24h), the exporter's window
(1h) and the whole tables (--all). Each run's peak resident memory is the
child's own (`wait4`), so the figures include the interpreter (~60 MB).

The filled database is consistent, so each run must also report every
invariant holding: the bench checks the check.

Then the exporter's invariant passes (`executor.store.invariant_watch`, decision
0210), in a process of their own, as its thread runs them on a fleet writing
`--rate` operations a second: the first pass judges the exporter's whole window
(1h); then, `--steady` times, the bench waits `--interval` seconds, writes what the
fleet wrote since its last write (`--rate` × the seconds, succeeded writes with
receipt, call row, outbox row and audit trail, stamped evenly over those seconds)
and runs the next pass, which judges what was touched since the previous pass
began, less the margins. `--recent 360000 --recent-window 4000` puts the same 100
operations a second in the hour before the first pass.

    .venv/bin/python -m bench.check_cost                  # 1M operations
    .venv/bin/python -m bench.check_cost --size 100000 --report /tmp/CHECK.md
    .venv/bin/python -m bench.check_cost --recent 360000 --recent-window 4000 --only-passes

Not part of `make test`; its figures are in bench/CHECK.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench import scrape_cost

AUDIT = [
    # Registration: every operation enters queued, or pending_approval.
    """
    INSERT INTO toolfence_audit_events (operation_id, call_id, tool_name, from_state, to_state,
                                        decision_code, generation, at)
    SELECT operation_id, call_id, tool_name, NULL,
           CASE WHEN state = 'pending_approval' THEN 'pending_approval' ELSE 'queued' END,
           'registered', 0, created_at
    FROM toolfence_operations ORDER BY created_at
    """,
    # Reservation, for every operation that ran.
    """
    INSERT INTO toolfence_audit_events (operation_id, call_id, tool_name, from_state, to_state,
                                        decision_code, generation, at)
    SELECT operation_id, call_id, tool_name, 'queued', 'started', 'reserved', 1, created_at + 0.1
    FROM toolfence_operations
    WHERE state IN ('started', 'succeeded', 'failed_terminal', 'retry_wait', 'reconciliation_pending')
    ORDER BY created_at
    """,
    # The way out of started.
    """
    INSERT INTO toolfence_audit_events (operation_id, call_id, tool_name, from_state, to_state,
                                        decision_code, generation, at)
    SELECT operation_id, call_id, tool_name, 'started', state, 'completed', 1, created_at + 0.5
    FROM toolfence_operations
    WHERE state IN ('succeeded', 'failed_terminal', 'retry_wait', 'reconciliation_pending')
    ORDER BY created_at
    """,
    "VACUUM ANALYZE",
]


# New operations for the passes: succeeded writes, each with its receipt, call row,
# outbox row and audit trail, stamped evenly over the last :span seconds (ids :prefix-g).
APPEND = [
    """
    WITH params AS (
      SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION) AS now
    ), rows AS (
      SELECT g, p.now - :span + g * (:span / :n) - 0.5 AS t FROM generate_series(1, :n) AS g, params p
    )
    INSERT INTO toolfence_operations (
        operation_id, request_id, call_id, position, tool_name, schema_version, mode, state,
        generation, intent_hash, arguments, context, attempts, available_at, queued_at, result,
        receipt, created_at, updated_at, started_at, finished_at)
    SELECT ':prefix' || g, 'req-:prefix' || g, 'call-:prefix' || g, 0, 'ledger.refund', 1, 'write',
           'succeeded', 1, md5(':prefix' || g), '{"amount":1}', '{"tenant":"t1","principal":"p1"}', 1,
           t, t, '{"ok":true}', 'rcpt-:prefix' || g, t, t + 0.5, t + 0.1, t + 0.5
    FROM rows
    """,
    """
    INSERT INTO toolfence_receipts (operation_id, generation, receipt, accepted, source, recorded_at)
    SELECT operation_id, 1, receipt, true, 'worker', finished_at
    FROM toolfence_operations WHERE operation_id LIKE ':prefix%'
    """,
    """
    INSERT INTO toolfence_calls (request_id, call_id, position, tool_name, operation_id, created_at)
    SELECT request_id, call_id, 0, tool_name, operation_id, created_at
    FROM toolfence_operations WHERE operation_id LIKE ':prefix%'
    """,
    """
    INSERT INTO toolfence_outbox (operation_id, created_at, published_at, attempts, next_attempt_at)
    SELECT operation_id, created_at, created_at + 0.01, 1, created_at
    FROM toolfence_operations WHERE operation_id LIKE ':prefix%'
    """,
    """
    INSERT INTO toolfence_audit_events (operation_id, call_id, tool_name, from_state, to_state,
                                        decision_code, generation, at)
    SELECT operation_id, call_id, tool_name, f, t, d, gen, created_at + dt
    FROM toolfence_operations,
         (VALUES (NULL, 'queued', 'registered', 0, 0.0), ('queued', 'started', 'reserved', 1, 0.1),
                 ('started', 'succeeded', 'completed', 1, 0.5)) AS e(f, t, d, gen, dt)
    WHERE operation_id LIKE ':prefix%'
    ORDER BY created_at, dt
    """,
]


@dataclass(frozen=True)
class Pass:
    label: str
    written: int
    """Operations the fleet wrote since the previous pass."""
    operations: int
    calls: int
    seconds: float
    violations: int


def passes_child(url: str, window: float, rate: float, interval: float, steady: int) -> None:
    """In its own process: the exporter's passes, as its thread runs them (JSON on stdout)."""
    from executor.store.invariant_watch import InvariantWatch
    from executor.telemetry.exporter import ExporterConfig, make_scrape_engine, read_transaction

    config = ExporterConfig(invariant_window_seconds=window)
    engine = make_scrape_engine(url, config)
    watch = InvariantWatch(window)
    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    done: list[dict[str, object]] = []

    def one(label: str, written: int) -> None:
        started = time.perf_counter()
        with read_transaction(engine, config) as conn:
            result = watch.run(conn)
        done.append({
            "label": label, "written": written, "operations": result.operations,
            "calls": result.calls, "seconds": time.perf_counter() - started,
            "violations": sum(result.violations.values()),
        })

    last_write = time.time()
    one(f"1: the whole {window:g} s window", 0)
    for cycle in range(1, steady + 1):
        time.sleep(interval)
        span = time.time() - last_write
        written = int(rate * span)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in APPEND:
                conn.execute(statement.replace(":prefix", f"op-new-{cycle}-")
                             .replace(":span", f"{span:.3f}").replace(":n", str(written)))
        last_write = time.time()
        one(f"{cycle + 1}: {interval:g} s after the one before", written)
    engine.dispose()
    print(json.dumps(done))


def run_passes(
    url: str, window: float, rate: float, interval: float, steady: int
) -> tuple[list[Pass], float]:
    """The passes' child process: each pass, and the child's peak memory (MB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.check_cost", "--passes-child", url, "--window", str(window),
             "--rate", str(rate), "--interval", str(interval), "--steady", str(steady)],
            env=env, stdout=out, stderr=err,
        )
        _, status, usage = os.wait4(process.pid, 0)
        out.seek(0)
        err.seek(0)
        output, errors = out.read(), err.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the passes failed: {errors.decode()[-500:]}")
    return [Pass(**entry) for entry in json.loads(output)], usage.ru_maxrss / 1024


@dataclass(frozen=True)
class Run:
    label: str
    args: tuple[str, ...]
    seconds: float
    peak_mb: float
    operations: int
    calls: int
    ok: bool


def run_check(url: str, label: str, *args: str) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}
    env["TOOLFENCE_DATABASE_URL"] = url
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "executor.cli", "check", "--json", *args],
            env=env, stdout=out, stderr=err,
        )
        # wait4: this child's own peak resident memory (ru_maxrss, in KB on Linux).
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        output, errors = out.read(), err.read()
    peak_kb = usage.ru_maxrss
    if process.returncode not in (0, 1):
        raise SystemExit(f"check {label} failed ({process.returncode}): {errors.decode()[-500:]}")
    report = json.loads(output)
    return Run(label, args, seconds, peak_kb / 1024, report["operations_checked"],
               report["calls_checked"], report["ok"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--admin-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--active", type=int, default=1000)
    parser.add_argument("--recent", type=int, default=20_000, help="recent operations")
    parser.add_argument("--recent-window", type=float, default=86_400.0,
                        help="seconds the recent operations lie within, divided by 0.9")
    parser.add_argument("--window", type=float, default=3600.0, help="the exporter's window")
    parser.add_argument("--rate", type=float, default=100.0, help="the fleet's operations a second")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between passes")
    parser.add_argument("--steady", type=int, default=3, help="passes after the first")
    parser.add_argument("--only-passes", action="store_true", help="skip the toolfence check runs")
    parser.add_argument("--report", type=Path, default=None, help="append a section to this file")
    parser.add_argument("--passes-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.passes_child:
        passes_child(args.passes_child, args.window, args.rate, args.interval, args.steady)
        return

    started = time.perf_counter()
    url = scrape_cost.create_filled(
        args.admin_dsn, args.size, args.active, args.recent, args.recent_window
    )
    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in AUDIT:
            conn.execute(statement)
        events = conn.execute("SELECT count(*) FROM toolfence_audit_events").fetchone()
    print(f"  audit events: {events[0] if events else 0:,}; filled in "
          f"{time.perf_counter() - started:.0f}s", flush=True)
    try:
        runs = [] if args.only_passes else [
            run_check(url, "default window (24h)"),
            run_check(url, "exporter's window (1h)", "--since", "1h"),
            run_check(url, "whole tables", "--all"),
        ]
        passes, passes_mb = run_passes(url, args.window, args.rate, args.interval, args.steady)
    finally:
        with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "toolfence_bench_scrape_{args.size}" WITH (FORCE)')
    lines = [
        f"| `toolfence check {' '.join(r.args) or '(--since 24h)'}` | {r.operations:,} | {r.calls:,} "
        f"| {r.seconds:.1f} | {r.peak_mb:.0f} | {'all hold' if r.ok else 'VIOLATED'} |"
        for r in runs
    ]
    table = "\n".join([
        "| run | operations judged | calls judged | seconds | peak memory (MB) | result |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
        *lines,
    ]) if runs else ""
    table += "\n\n" + "\n".join([
        f"The exporter's passes ({args.window:g} s window, a fleet of {args.rate:g} operations a "
        f"second), one process, peak memory {passes_mb:.0f} MB:",
        "",
        "| pass | operations written since the last | operations judged | calls judged | seconds | result |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
        *(f"| {p.label} | {p.written:,} | {p.operations:,} | {p.calls:,} | {p.seconds:.1f} "
          f"| {'all hold' if not p.violations else 'VIOLATED'} |" for p in passes),
    ])
    table = table.strip()
    print(table)
    if args.report is not None:
        with args.report.open("a", encoding="utf-8") as report:
            report.write(
                f"\n## {time.strftime('%Y-%m-%d')}: {args.size:,} operations ({args.recent:,} in the "
                f"last {0.9 * args.recent_window:g} s, {args.active:,} active), "
                f"{events[0] if events else 0:,} audit events\n\n"
                f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, PostgreSQL on "
                f"the same machine.\n\n{table}\n"
            )
    if not all(r.ok for r in runs) or any(p.violations for p in passes):
        raise SystemExit("the filled database should pass every invariant")


if __name__ == "__main__":
    main()
