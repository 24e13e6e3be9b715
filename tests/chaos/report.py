"""Write a campaign's report as Markdown (bench/CHAOS.md for the long run)."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.chaos.history import read
from tests.chaos.nemesis import AMBIGUOUS_KINDS, KILL_KINDS, PAUSE_KINDS

DESCRIPTIONS = {
    "kill_child": "SIGKILL of a worker's pool child (busy one preferred)",
    "kill_node": "SIGKILL of a worker's main process and its children; replaced",
    "kill_after_effect": "fault point: SIGKILL after the downstream effect",
    "kill_before_complete": "fault point: SIGKILL before completion",
    "pause": "SIGSTOP past the lease (lease + reconciler period + up to a lease), then SIGCONT",
    "ambiguous_reserve": "fault point: reservation committed, worker told the connection failed",
    "ambiguous_complete": "fault point: completion committed, worker told the connection failed",
    "pg_terminate_worker": "pg_terminate_backend of worker sessions (one or all)",
    "pg_terminate_relay": "pg_terminate_backend of relay sessions (one or all)",
    "pg_terminate_reconciler": "pg_terminate_backend of reconciler sessions (one or all)",
    "pg_restart": "PostgreSQL restarted -m immediate (private cluster)",
    "redis_restart_off": "Redis SIGKILLed and restarted, persistence off",
    "redis_restart_aof": "Redis SIGKILLed and restarted, AOF on",
    "relay_kill_after_publish": "fault point: relay SIGKILLed between publish and mark (2 relays)",
}


# What earlier runs of this campaign found, and what was done about each (kept with
# the report so that regenerating it does not lose them).
FINDINGS = """\
## What the campaign found

Fixed (each with a commit and a record in docs/decisions/: 0039, 0015, 0040 and 0034, in this order):

1. **Duplicate invoice from a paused owner (I1).** A worker SIGSTOPped between
   `ensure_owner()` and its `create_invoice` outlived its lease; the reconciler's
   lookup answered "not done" and requeued; the next generation created the
   invoice, and the continued worker created a second one. The reference
   ledger's lookup now closes the door on the generation it answers for
   (`ledger/service.py`: `find_invoice(reference, fencing_token)` raises the
   reference's fence in the same transaction; `create_invoice` refuses older
   generations under the same row lock, recorded in `ledger_fenced`).
2. **Calls stuck `queued` for ever behind a `reconciliation_pending` write (I2).**
   Later writes waited for a terminal predecessor and nothing woke them
   (`executor/store/ordering.py`): now `predecessor_failed` counts a pending predecessor,
   a read's reservation needs settled (not terminal) predecessors, and
   `mark_unknown` (`executor/store/operations.py`) wakes the successors.
3. **Ambiguous-commit fault points rolled back instead of committing**
   (`executor/worker/runner.py`): `reserve_commit`/`complete_commit` fired inside the
   transaction, so "ambiguous" was an abort; they now fire after the commit.
4. **Database errors escaping the worker** (`executor/worker/runner.py`): before the
   handler (approval check), while recording a receipt, releasing to retry or
   marking an unknown outcome, an error went into Celery and left the
   operation `started` until its lease expired — an `unsafe` write then went to
   a person although nothing (or a known receipt) had happened. Now released
   to retry, retried, or checked for ambiguity as `complete` already was; a
   read whose connection failed is retryable rather than `failed_terminal`.

Seen and left alone (reported):

- Celery/kombu 5.7 with Redis: a worker's main process can stop ("Unrecoverable
  error: AttributeError: 'NoneType' object has no attribute 'hostname'") when the
  broker connection resets while a late ack is sent. It exits with Celery's
  status 1 (until 2026-12-03 `toolfence worker` dropped that status and exited 0,
  which a supervisor with `Restart=on-failure` would not have restarted); the
  campaign's supervisor replaces it, as `restart: unless-stopped` does in
  docker-compose.
- A transient database error inside a tool's access rule at run time ends the
  call `permission_denied` (hooks fail closed, `executor/core/admission.py`).
- A lookup that raises in the reconciler sends the operation to
  `reconciliation_pending` (`lookup_failed`) rather than asking again on the
  next sweep (`reconciler/sweep.py`).
"""


def _describe(kind: str) -> str:
    if kind.startswith("net_"):
        _, mode, factor = kind.split("_")
        return f"proxy between workers and PostgreSQL/Redis: {mode} for {factor[:-1]} x lease"
    return DESCRIPTIONS.get(kind, "")


def _finished(run_dir: Path) -> str:
    history = run_dir / "history.jsonl"
    when = history.stat().st_mtime if history.exists() else time.time()
    return time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(when))


def _git_commit() -> str:
    if os.environ.get("TOOLFENCE_CHAOS_COMMIT"):  # a run from an exported snapshot has no .git
        return os.environ["TOOLFENCE_CHAOS_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=False).stdout.strip() or "?"
    except OSError:
        return "?"


def timeline(history_path: Path, bucket_seconds: float = 60.0) -> list[dict[str, Any]]:
    """Per bucket of the chaos window: operations settled, faults fired by group."""
    start = None
    settled: Counter[int] = Counter()
    faults: dict[int, Counter[str]] = defaultdict(Counter)
    for event in read(history_path):
        kind = event["kind"]
        if kind == "phase" and event.get("phase") == "chaos_started":
            start = event["t"]
        if start is None:
            continue
        index = int((event["t"] - start) // bucket_seconds)
        if kind == "result":
            settled[index] += 1
        elif kind in ("fault", "fault_point"):
            fault = event["fault"]
            group = ("kills" if fault in KILL_KINDS else "pauses" if fault in PAUSE_KINDS
                     else "ambiguous" if fault in AMBIGUOUS_KINDS else "other")
            faults[index][group] += 1
    rows = []
    for index in sorted(set(settled) | set(faults)):
        rows.append({"minute": index, "results": settled[index], **faults[index]})
    return rows


def write_markdown(report: dict[str, Any], path: Path, run_dir: Path) -> None:
    cfg, machine, counts = report["config"], report["machine"], report["counts"]
    verdict = "PASSED" if report["passed"] else "FAILED"
    lines = [
        "# Chaos campaign",
        "",
        f"{verdict}: `{cfg['label']}` run of {report['seconds']['chaos']:.0f} s of faults, "
        f"finished {_finished(run_dir)}, on "
        + (f"an exported snapshot of commit `{os.environ['TOOLFENCE_CHAOS_COMMIT']}`."
           if os.environ.get("TOOLFENCE_CHAOS_COMMIT")
           else f"the working tree at commit `{_git_commit()}`."),
        "",
        "Reproduce: `python -m tests.chaos.campaign --minutes "
        f"{cfg['chaos_seconds'] / 60:g} --seed {cfg['seed']} --report bench/CHAOS.md` "
        "(`make chaos-long`); the CI-sized run is `pytest -m chaos tests/chaos` (`make chaos`).",
        "",
        "## Machine",
        "",
        f"- {machine.get('nproc')} CPUs (`nproc`), {machine.get('memory_gib')} GiB memory, "
        f"{machine.get('platform')}",
        f"- Python {machine.get('python')}, PostgreSQL {machine.get('postgresql')}, "
        f"{machine.get('redis', 'Redis ?')}",
        f"- Celery {machine.get('celery')}, kombu {machine.get('kombu')}, SQLAlchemy "
        f"{machine.get('sqlalchemy')}, psycopg {machine.get('psycopg')}",
        f"- load average at the end: {machine.get('loadavg', '?')} — the machine is shared: other "
        "engineers' test suites ran at the same time, so throughput and latency are pessimistic",
        "",
        "## Setup",
        "",
        "- private PostgreSQL cluster and private `redis-server` (free ports, own data dirs); "
        "workers reach both through the campaign's TCP proxy",
        f"- fleet: {cfg['relays']} relays, {cfg['workers']} workers x {cfg['concurrency']} "
        f"pool children, 1 reconciler every {cfg['reconcile_every']} s; lease {cfg['lease_seconds']} s; "
        f"stale `queued` republished after {cfg['lease_seconds']} s",
        f"- workload: {cfg['clients']} closed-loop clients, requests of 1-4 calls: reads and writes of "
        "every effect contract (`credit` idempotent, `transfer` fenced, `create_invoice` lookup, "
        "`send_notice` unsafe), ~5% calls admission must reject; ledger latency "
        f"{cfg['ledger_latency_ms']} ms per write; seed {cfg['seed']}",
        "",
        "## Result",
        "",
        "| lost | duplicated | unexpected | recovered | fenced | accepted stale writes |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {counts['lost']} | {counts['duplicated']} | {counts['unexpected']} | {counts['recovered']} "
        f"| {counts['fenced']} | {counts['accepted_stale_writes']} |",
        "",
        "| invariant | holds | violations |",
        "| --- | --- | ---: |",
    ]
    names = {
        "I1": "at most one accepted effect per operation",
        "I2": "quiet within 2 x lease + one reconciler period after the faults stop",
        "I3": "no stale write accepted (fenced downstream, completion)",
        "I4": "nothing admitted lost, nothing unadmitted appears",
        "I5": "legal transitions, monotonic generation",
        "I6": "one terminal result per call id, with its tool name",
        "I7": "rejected calls invoked no handler",
    }
    for name, verdict_ in report["invariants"].items():
        lines.append(f"| {name} {names[name]} | {'yes' if verdict_['ok'] else '**no**'} | "
                     f"{verdict_['violations']} |")
    quiet = report["quiet"]
    lines += [
        "",
        f"- operations admitted: {counts['operations']} (requests {counts['requests']}, proposed calls "
        f"{counts['calls']}, rejected at admission {counts['rejected_at_admission']}); reservations "
        f"{counts['reservations']}; accepted effects {counts['effects_accepted']}",
        f"- quiet {quiet.get('quiet_seconds')} s after the faults stopped (bound "
        f"{quiet.get('bound_seconds')} s)",
        f"- throughput under faults {report['throughput_ops_per_second']} operations/s; call latency "
        f"(enqueue to settled, per request) {report['latency_seconds']}",
        f"- effects a non-fencing downstream accepted from an older generation after a newer one "
        f"was reserved (deduplicated or never retried, so not duplicates): "
        f"{counts['late_unfenced_effects'] or 0}",
        f"- client waits given up after 20 s (the operation carried on): {counts['result_timeouts']}; "
        f"ambiguous enqueue commits resolved by reading back: {counts['ambiguous_enqueues']}",
        "- fleet processes that died without the harness killing them (replaced; a worker that "
        "starts while the database is unreachable exits 1 by design): "
        f"{counts['unexpected_member_exits']}"
        + "".join(f"\n  - {reason}: {n}" for reason, n in report.get("member_exits", {}).items()),
        "",
        "Final states by tool:",
        "",
        "| tool | " + " | ".join(["succeeded", "failed_terminal", "reconciliation_pending"]) + " |",
        "| --- | ---: | ---: | ---: |",
    ]
    for tool, states in report["by_tool"].items():
        lines.append(f"| `{tool}` | {states.get('succeeded', 0)} | {states.get('failed_terminal', 0)} | "
                     f"{states.get('reconciliation_pending', 0)} |")
    lines += ["", "Why `reconciliation_pending` (a person decides) and `failed_terminal`:", ""]
    for reason, n in report["pending_reasons"].items():
        lines.append(f"- pending — {reason}: {n}")
    for code, n in report["failed_codes"].items():
        lines.append(f"- failed — {code}: {n}")
    lines += [
        "",
        "## Faults",
        "",
        "| fault | asked at least | fired | what |",
        "| --- | ---: | ---: | --- |",
    ]
    fired = report["nemesis"]["fired"]
    for kind, asked in report["nemesis"]["targets"].items():
        lines.append(f"| `{kind}` | {asked} | {fired.get(kind, 0)} | {_describe(kind)} |")
    groups = report["fault_groups"]
    lines += [
        "",
        f"Totals: kills {groups['kills (1)']}, zombie pauses {groups['zombie pauses (2)']}, ambiguous "
        f"commits {groups['ambiguous commits (3)']}; workers replaced {fired.get('worker_replaced', 0)}, "
        f"relays replaced {fired.get('relay_replaced', 0)}; network faults on the PostgreSQL path "
        f"{fired.get('net_route_pg', 0)}, on the Redis path {fired.get('net_route_redis', 0)}.",
        "",
        "Requirements of the run:",
        "",
    ]
    for name, requirement in report["requirements"].items():
        if name in report["nemesis"]["targets"]:
            continue
        lines.append(f"- {name}: asked {requirement['asked']}, got {requirement['got']} "
                     f"({'ok' if requirement['ok'] else 'NOT MET'})")
    lines += ["", FINDINGS.rstrip()]
    rows = timeline(run_dir / "history.jsonl")
    if rows:
        lines += [
            "",
            "## Per minute",
            "",
            "| minute | calls settled | kills | pauses | ambiguous | other faults |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in rows:
            lines.append(f"| {row['minute']} | {row['results']} | {row.get('kills', 0)} | "
                         f"{row.get('pauses', 0)} | {row.get('ambiguous', 0)} | {row.get('other', 0)} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
