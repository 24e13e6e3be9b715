"""bench/PARTITIONS.md and its timeline picture, from a partitions campaign's history.

The Markdown has the shape of bench/CHAOS.md (machine, setup, result table,
invariants, faults by kind) plus what each network and clock fault did to
throughput and latency while it lasted, and how long after its heal calls
settled again. The picture (`<report>.png`, matplotlib, imported here only: it
is no runtime dependency) is Jepsen's timeline: calls settled per second over
the chaos window, each fault window shaded by kind.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.chaos.history import read
from tests.chaos.partitions import CLOCK_KINDS, NETWORK_KINDS

WINDOW_KINDS = (*NETWORK_KINDS, *CLOCK_KINDS)
WHAT = {
    "part_db": "one node (worker, relay or reconciler) cut from PostgreSQL, both ways",
    "part_broker": "one node cut from Redis, both ways",
    "part_halves": "every node (PostgreSQL and Redis included) in one of two random halves; "
                   "no packet crosses",
    "part_oneway_to_db": "one node's packets to PostgreSQL dropped; PostgreSQL's to it pass",
    "part_oneway_from_db": "PostgreSQL's packets to one node dropped; the node's pass",
    "loss": "10-40 % of the packets between one node and PostgreSQL or Redis dropped, each way",
    "delay": "every packet between one node and PostgreSQL or Redis behind a 64-256 kbit/s "
             "queue, each way (delay with jitter)",
    "reorder": "a quarter of those packets behind the slow queue: overtaken by later ones "
               "(packet reordering)",
    "duplicate": "20-50 % of those packets sent twice, each way",
    "clock_skew": "a worker's or relay's wall clock 1-15 min ahead or behind (libfaketime)",
    "clock_jump": "a worker's or relay's wall clock jumped 1-15 min one way, then past real time "
                  "the other way, then back",
    "kill_child": "SIGKILL of a worker's pool child (busy when one was)",
    "kill_node": "SIGKILL of a whole worker (main process and children)",
    "kill_after_effect": "fault point: SIGKILL after the downstream effect, before recording",
    "kill_before_complete": "fault point: SIGKILL before the completing transaction",
    "pause": "SIGSTOP past the lease, then SIGCONT (a zombie owner)",
    "ambiguous_reserve": "fault point: reservation committed, connection error raised",
    "ambiguous_complete": "fault point: completion committed, connection error raised",
    "pg_terminate_worker": "pg_terminate_backend of workers' sessions",
    "pg_terminate_relay": "pg_terminate_backend of relays' sessions",
    "pg_terminate_reconciler": "pg_terminate_backend of the reconciler's sessions",
    "pg_restart": "PostgreSQL restarted -m immediate (in its namespace)",
    "redis_restart_off": "Redis SIGKILLed and restarted without persistence",
    "redis_restart_aof": "Redis SIGKILLed and restarted with AOF",
    "relay_kill_after_publish": "fault point: relay SIGKILLed between publish and mark",
}


def windows(history_path: Path) -> tuple[float, float, list[dict[str, Any]]]:
    """(chaos start, faults stopped, each network or clock fault with start and end)."""
    start = stop = 0.0
    open_: dict[str, list[dict[str, Any]]] = defaultdict(list)
    found: list[dict[str, Any]] = []
    for event in read(history_path):
        kind = event["kind"]
        if kind == "phase" and event.get("phase") == "chaos_started":
            start = event["t"]
        elif kind == "phase" and event.get("phase") == "faults_stopped":
            stop = event["t"]
        elif kind == "fault" and event["fault"] in WINDOW_KINDS:
            entry = {**event, "start": event["t"], "end": None}
            open_[event["fault"]].append(entry)
            found.append(entry)
        elif kind == "fault_end" and event["fault"] in WINDOW_KINDS and open_[event["fault"]]:
            open_[event["fault"]].pop(0)["end"] = event["t"]
    for entry in found:
        entry["end"] = entry["end"] or stop
    return start, stop, found


def effects(history_path: Path) -> dict[str, dict[str, Any]]:
    """Per fault kind: settled calls/s and latency while it lasted, against no such fault."""
    start, stop, spans = windows(history_path)
    results = [(e["t"], e["seconds"]) for e in read(history_path)
               if e["kind"] == "result" and start <= e["t"] <= stop]
    net_spans = [s for s in spans if s["fault"] in NETWORK_KINDS]

    def inside(t: float, chosen: list[dict[str, Any]]) -> bool:
        return any(s["start"] <= t <= s["end"] for s in chosen)

    quiet_seconds = max(1e-9, (stop - start) - sum(s["end"] - s["start"] for s in net_spans))
    quiet_results = [r for r in results if not inside(r[0], net_spans)]
    out: dict[str, dict[str, Any]] = {
        "no network fault": {
            "windows": None, "seconds": round(quiet_seconds, 1),
            "per_second": round(len(quiet_results) / quiet_seconds, 1),
            **_latency([latency for _, latency in quiet_results]),
        }
    }
    for kind in WINDOW_KINDS:
        chosen = [s for s in spans if s["fault"] == kind]
        if not chosen:
            continue
        seconds = max(1e-9, sum(s["end"] - s["start"] for s in chosen))
        during = [r for r in results if inside(r[0], chosen)]
        # After each heal: how long until a call settles again.
        recoveries = []
        for span in chosen:
            after = [t for t, _ in results if t > span["end"]]
            if after:
                recoveries.append(min(after) - span["end"])
        out[kind] = {
            "windows": len(chosen), "seconds": round(seconds, 1),
            "per_second": round(len(during) / seconds, 1), **_latency([lat for _, lat in during]),
            "first_settle_after_heal_max": round(max(recoveries), 2) if recoveries else None,
        }
    return out


def _latency(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 2),
            "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2)}


def timeline_png(history_path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, stop, spans = windows(history_path)
    per_second: dict[int, int] = defaultdict(int)
    kills: list[float] = []
    for event in read(history_path):
        if event["kind"] == "result" and event["t"] >= start:
            per_second[int(event["t"] - start)] += 1
        elif event["kind"] in ("fault", "fault_point") and event["fault"] not in WINDOW_KINDS:
            kills.append(event["t"] - start)
    end = int(max(stop - start, max(per_second, default=0))) + 1
    xs = list(range(end))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    top.plot(xs, [per_second.get(x, 0) for x in xs], color="black", linewidth=0.8)
    top.set_ylabel("calls settled / s")
    top.set_title("Partitions campaign: throughput and fault windows")
    colors = plt.get_cmap("tab20")
    for row, kind in enumerate(WINDOW_KINDS):
        for span in (s for s in spans if s["fault"] == kind):
            left, width = span["start"] - start, max(0.2, span["end"] - span["start"])
            top.axvspan(left, left + width, color=colors(row), alpha=0.25, linewidth=0)
            bottom.broken_barh([(left, width)], (row - 0.4, 0.8), color=colors(row))
    bottom.scatter(kills, [len(WINDOW_KINDS)] * len(kills), marker="|", color="grey", s=40)
    bottom.set_yticks(range(len(WINDOW_KINDS) + 1), [*WINDOW_KINDS, "process faults"], fontsize=8)
    bottom.set_xlabel("seconds since the chaos window opened")
    bottom.set_xlim(0, end)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=False).stdout.strip() or "?"
    except OSError:
        return "?"


def write_partitions_markdown(report: dict[str, Any], path: Path, run_dir: Path,
                              commit: str | None = None) -> None:
    cfg, machine, counts = report["config"], report["machine"], report["counts"]
    history = run_dir / "history.jsonl"
    picture = path.with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    timeline_png(history, picture)
    minutes = cfg["chaos_seconds"] / 60
    finished = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(history.stat().st_mtime))
    lines = [
        "# Partitions campaign",
        "",
        f"{'PASSED' if report['passed'] else 'FAILED'}: `{cfg['label']}` run of "
        f"{report['seconds']['chaos']:.0f} s of faults ({minutes:g} minutes asked), finished "
        f"{finished}, on the working tree at commit `{commit or _commit()}`.",
        "",
        f"Reproduce (root): `python -m tests.chaos.partitions --minutes {minutes:g} --seed {cfg['seed']} "
        f"--report {path}` (`make chaos-partitions`, 30 minutes); the CI-sized run is "
        "`pytest tests/chaos/test_partitions.py` (in `make test`).",
        "",
        "## Machine",
        "",
        f"- {machine.get('nproc')} CPUs, {machine.get('memory_gib')} GiB memory, {machine.get('platform')}",
        f"- Python {machine.get('python')}, PostgreSQL {machine.get('postgresql')}, "
        f"{machine.get('redis', 'Redis ?')}; Celery {machine.get('celery')}, kombu {machine.get('kombu')}",
        f"- load average at the end: {machine.get('loadavg', '?')} (shared machine: other test suites "
        "ran at the same time)",
        "",
        "## Setup",
        "",
        "- every node in its own network namespace on one bridge (10.213.0.0/24, "
        "`tests/chaos/netns.py`): PostgreSQL (`db`), Redis (`broker`), each relay, each worker "
        "(a replacement gets a new namespace), the reconciler; the harness (clients, checker) "
        "reaches PostgreSQL by its Unix socket and is in no partition",
        f"- fleet: {cfg['relays']} relays, {cfg['workers']} workers x {cfg['concurrency']} pool children, "
        f"a reconciler every {cfg['reconcile_every']} s; lease {cfg['lease_seconds']} s",
        f"- workload: {cfg['clients']} closed-loop clients, every effect contract, ~5 % calls "
        f"admission rejects; seed {cfg['seed']}",
        "- workers and relays run under libfaketime (wall clock only; the monotonic clock is real)",
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
    for name, verdict in report["invariants"].items():
        lines.append(f"| {name} | {'yes' if verdict['ok'] else '**no**'} | {verdict['violations']} |")
    quiet = report["quiet"]
    lines += [
        "",
        f"- operations admitted {counts['operations']} (requests {counts['requests']}, calls "
        f"{counts['calls']}, rejected at admission {counts['rejected_at_admission']}); accepted effects "
        f"{counts['effects_accepted']}",
        f"- quiet {quiet.get('quiet_seconds')} s after the last fault was healed (bound "
        f"{quiet.get('bound_seconds')} s = 2 x lease + one reconciler period)",
        f"- throughput under faults {report['throughput_ops_per_second']} operations/s; call latency "
        f"{report['latency_seconds']}",
        f"- fleet processes that died without the harness killing them: "
        f"{counts['unexpected_member_exits']}"
        + "".join(f"\n  - {reason}: {n}" for reason, n in report.get("member_exits", {}).items()),
        "",
        "## Faults",
        "",
        "| fault | asked at least | fired | what |",
        "| --- | ---: | ---: | --- |",
    ]
    fired = report["nemesis"]["fired"]
    for kind, asked in report["nemesis"]["targets"].items():
        lines.append(f"| `{kind}` | {asked} | {fired.get(kind, 0)} | {WHAT.get(kind, '')} |")
    lines += [
        "",
        f"Workers replaced {fired.get('worker_replaced', 0)}, relays replaced "
        f"{fired.get('relay_replaced', 0)}.",
        "",
        "## What each fault did to throughput and latency",
        "",
        f"![timeline]({picture.name})",
        "",
        "Calls settled per second while faults of a kind were on (all windows of the kind "
        "together), the latency (enqueue to settled) of the requests that settled then, and "
        "the longest wait after a heal before the next call settled. Process faults fire "
        "throughout, so every row has them too.",
        "",
        "| while | windows | seconds | calls settled/s | p50 s | p95 s | longest wait after heal s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = effects(history)
    waits = [r["first_settle_after_heal_max"] for r in rows.values()
             if r.get("first_settle_after_heal_max") is not None]
    for kind, row in rows.items():
        lines.append(f"| {kind} | {row['windows'] or '-'} | {row['seconds']} | {row['per_second']} | "
                     f"{row['p50']} | {row['p95']} | {row.get('first_settle_after_heal_max', '-')} |")
    base = rows["no network fault"]["per_second"] or 1.0
    stopped = [k for k, r in rows.items() if k != "no network fault" and r["per_second"] < 0.5 * base]
    dented = [k for k, r in rows.items() if k != "no network fault" and k not in stopped]
    lines += [
        "",
        f"Below half the throughput of the time without a network fault: {', '.join(stopped) or 'none'} "
        "(a split in halves leaves most workers away from PostgreSQL or Redis, so little can "
        "run until it heals); within half of it: "
        f"{', '.join(dented) or 'none'} (one node of several is cut off, slowed or skewed, and "
        "the others carry the work; what it held is taken over after its lease or by the "
        "reconciler).",
    ]
    bound, longest = quiet.get("bound_seconds"), max(waits, default=0.0)
    over = bound is not None and longest > bound
    lines += [
        "",
        f"Longest wait after any heal before a call settled again: {longest} s "
        f"(the quiet bound is {bound} s){' — OVER' if over else ''}.",
        "",
        FINDINGS.strip(), "",
    ]
    path.write_text("\n".join(lines))


FINDINGS = """
## Seen and left alone

- **No `netem` on this kernel** (CONFIG_NET_SCH_NETEM is not set). Loss and
  partitions are nftables rules in the bridge (`numgen random`, `drop`);
  duplication is nft `dup`; delay and reordering come from an HTB class with a
  low rate that some or all packets are steered into (`meta priority`). The
  delay is therefore a congested link's (serialisation plus queue, so it grows
  with the bytes sent), not a fixed latency, and the reordering is of the
  packets sent to the slow class. `tests/chaos/test_netns.py` measures each of
  them on real traffic.
- **libfaketime 0.9.10 and Python 3.11**: with the monotonic clock faked (the
  default), a condition wait on the monotonic clock waits the offset longer (a
  worker 10 minutes ahead hangs 10 minutes in its first `Event.wait`); with
  `FAKETIME_DONT_FAKE_MONOTONIC=1`, `time.sleep` fails with EINVAL (libfaketime
  issue 426). The campaign runs with the monotonic clock real, as an NTP step
  leaves it, and a six-line preload restores the kernel's `clock_nanosleep` for
  the monotonic clock (`tests/chaos/netns.py`).
- A worker or relay that starts while its namespace is cut from PostgreSQL
  exits 1 ("cannot reach the database") by design; the supervisor starts a
  replacement in a new namespace. A worker's main process can also stop on
  Celery/kombu's "'NoneType' object has no attribute 'hostname'" when its broker
  connection breaks during a late ack (bench/CHAOS.md reports the same); it
  exits 1 and is replaced.
- A worker whose wall clock is off still measures its own histograms on it:
  `toolfence_enqueue_to_terminal_seconds` is off by the skew (clamped at 0 when
  behind), and a tool's `ctx.deadline` is the worker's `time.time()` plus the
  timeout. No outcome depends on either: leases and audit times are on the
  database clock (`tests/fleet/test_fleet_clock_skew.py`).
- The broker is one Redis; a three-node RabbitMQ cluster across namespaces was
  not run (decision 0226). The quorum-queue setting is tested on one RabbitMQ
  node in `make test` (`tests/fleet/test_fleet_quorum.py`).
"""
