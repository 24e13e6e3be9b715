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

    .venv/bin/python -m bench.check_cost                  # 1M operations
    .venv/bin/python -m bench.check_cost --size 100000 --report /tmp/CHECK.md

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
    parser.add_argument("--recent", type=int, default=20_000, help="operations inside the last day")
    parser.add_argument("--report", type=Path, default=None, help="append a section to this file")
    args = parser.parse_args()

    day = 86_400.0
    started = time.perf_counter()
    url = scrape_cost.create_filled(args.admin_dsn, args.size, args.active, args.recent, day)
    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in AUDIT:
            conn.execute(statement)
        events = conn.execute("SELECT count(*) FROM toolfence_audit_events").fetchone()
    print(f"  audit events: {events[0] if events else 0:,}; filled in "
          f"{time.perf_counter() - started:.0f}s", flush=True)
    try:
        runs = [
            run_check(url, "default window (24h)"),
            run_check(url, "exporter's window (1h)", "--since", "1h"),
            run_check(url, "whole tables", "--all"),
        ]
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
    ])
    print(table)
    if args.report is not None:
        with args.report.open("a", encoding="utf-8") as report:
            report.write(
                f"\n## {time.strftime('%Y-%m-%d')}: {args.size:,} operations ({args.recent:,} in the "
                f"last day, {args.active:,} active), {events[0] if events else 0:,} audit events\n\n"
                f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, PostgreSQL on "
                f"the same machine.\n\n{table}\n"
            )
    if not all(r.ok for r in runs):
        raise SystemExit("the filled database should pass every invariant")


if __name__ == "__main__":
    main()
