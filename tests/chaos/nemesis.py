"""The faults: who injects what, when, and how each firing is counted.

Three lanes run side by side while the campaign's chaos window is open:

- the **process lane** follows a timeline drawn up front from the campaign's
  targets (so the counts asked for are met, not hoped for): SIGKILL of a
  worker's pool child or of a whole worker (main process and children), SIGSTOP
  past the lease then SIGCONT (the zombie owner), and `pg_terminate_backend` of
  the sessions of one role (worker, relay, reconciler — each role's sessions
  carry their own `application_name`);
- the **infrastructure lane** runs one heavy fault at a time: PostgreSQL
  restarted `-m immediate`, Redis SIGKILLed and restarted with persistence off
  or with AOF on, and network faults on the workers' path to PostgreSQL or
  Redis through the proxy (latency, blackhole, reset) lasting 0.5×, 1× and 3×
  the lease;
- the **fault points** inside the fleet's processes (`executor/faults.py`):
  kills after the downstream effect and before completion, ambiguous commits of
  the reservation and of the completion, and the relay's kill between publish
  and mark. They fire on their own with a probability the controller adjusts
  every few seconds towards its target, and log every firing to a file.

The supervisor replaces every worker or relay that died (killed or not), and
records deaths the harness did not cause. `stop()` ends every fault at once:
fault points off, proxy healed, paused processes continued, PostgreSQL and
Redis running — the moment the quiet clock starts.
"""

from __future__ import annotations

import heapq
import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from executor.cli.fleet import Fleet, Member, children_of
from tests.chaos.history import History
from tests.chaos.proxy import ProxyControl
from tests.chaos.services import PrivatePostgres, PrivateRedis

# Fault kinds, grouped as the campaign's brief numbers them.
KILL_KINDS = ("kill_child", "kill_node", "kill_after_effect", "kill_before_complete")
PAUSE_KINDS = ("pause",)
AMBIGUOUS_KINDS = ("ambiguous_reserve", "ambiguous_complete")
TERMINATE_KINDS = ("pg_terminate_worker", "pg_terminate_relay", "pg_terminate_reconciler")
NET_MODES = ("latency", "blackhole", "reset")
NET_FACTORS = (0.5, 1.0, 3.0)
NET_KINDS = tuple(f"net_{mode}_{factor}x" for mode in NET_MODES for factor in NET_FACTORS)
INFRA_KINDS = ("pg_restart", "redis_restart_off", "redis_restart_aof", *NET_KINDS)
RELAY_KINDS = ("relay_kill_after_publish",)
PROCESS_KINDS = ("kill_child", "kill_node", "pause", *TERMINATE_KINDS)
POINT_KINDS = ("kill_after_effect", "kill_before_complete", *AMBIGUOUS_KINDS, *RELAY_KINDS)

# fault point name and action → kind (what `executor/faults.py` logs)
POINT_KIND_OF = {
    ("after_effect", "kill"): "kill_after_effect",
    ("before_complete", "kill"): "kill_before_complete",
    ("reserve_commit", "ambiguous"): "ambiguous_reserve",
    ("complete_commit", "ambiguous"): "ambiguous_complete",
    ("relay_after_publish", "kill"): "relay_kill_after_publish",
}
POINT_SPEC = {
    "kill_after_effect": ("worker", "after_effect", "kill"),
    "kill_before_complete": ("worker", "before_complete", "kill"),
    "ambiguous_reserve": ("worker", "reserve_commit", "ambiguous"),
    "ambiguous_complete": ("worker", "complete_commit", "ambiguous"),
    "relay_kill_after_publish": ("relay", "relay_after_publish", "kill"),
}


@dataclass
class Setup:
    """What the nemesis acts on."""

    fleet: Fleet
    postgres: PrivatePostgres
    redis: PrivateRedis
    proxy: ProxyControl | None  # None in the partitions campaign (the network is real there)
    database: str
    lease_seconds: float
    reconcile_every: float
    run_dir: Path

    @property
    def fault_log(self) -> Path:
        return self.run_dir / "fault-points.log"

    def points_file(self, role: str) -> Path:
        return self.run_dir / f"fault-points-{role}.spec"


@dataclass
class Counts:
    fired: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, n: int = 1) -> None:
        with self.lock:
            self.fired[kind] += n


def _exit_reason(member: Member) -> str:
    """The last CRITICAL/ERROR line of a member's log: why it stopped on its own."""
    try:
        lines = member.log_text().splitlines()
    except OSError:
        return "?"
    for line in reversed(lines):
        if "CRITICAL" in line or "Unrecoverable" in line:
            return line[-300:]
    return lines[-1][-300:] if lines else "?"


def _ready(member: Member) -> bool:
    return member.alive() and member.said("toolfence worker ready")


class Nemesis:
    def __init__(
        self,
        setup: Setup,
        history: History,
        *,
        chaos_seconds: float,
        targets: dict[str, int],
        seed: int,
        workers: int,
        relays: int,
    ) -> None:
        self.s = setup
        self.history = history
        self.duration = chaos_seconds
        self.targets = targets
        self.rng = random.Random(seed)
        self.workers = workers
        self.relays = relays
        self.counts = Counts()
        self._stop = threading.Event()
        self._supervise_stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._paused: list[tuple[float, int, str, bool]] = []  # (resume at, pid, kind, group)
        self._paused_lock = threading.Lock()
        self._killed_pids: set[int] = set()
        self._seen_dead: set[int] = set()
        self._points_offset = 0
        self._probabilities: dict[str, float] = {}
        self._worker_index = workers
        self._relay_index = relays
        self._infra_busy = threading.Event()
        self.started_at = 0.0
        self.stopped_at = 0.0
        self.errors: list[str] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.history.add("phase", phase="chaos_started", seconds=self.duration)
        self._init_point_probabilities()
        for target, name in (
            (self._process_lane, "nemesis-process"),
            (self._infra_lane, "nemesis-infra"),
            (self._points_lane, "nemesis-points"),
            (self._supervisor, "nemesis-supervisor"),
        ):
            thread = threading.Thread(target=self._guard(target), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _guard(self, target: Any) -> Any:
        def run() -> None:
            try:
                target()
            except Exception as exc:  # a harness bug must fail the run, not hang it
                self.errors.append(f"{threading.current_thread().name}: {type(exc).__name__}: {exc}")
                self.history.add("harness_error", where=threading.current_thread().name, error=repr(exc))

        return run

    def wait(self) -> None:
        """Sleep until the chaos window closes."""
        self._stop.wait(max(0.0, self.started_at + self.duration - time.monotonic()))

    def stop(self) -> float:
        """End every fault now; returns the monotonic time at which all were healed."""
        self._stop.set()
        self._write_points({"worker": "", "relay": ""})
        for thread in self._threads:
            if thread.name != "nemesis-supervisor":
                thread.join(120)
        self._resume_all()
        if self.s.proxy is not None:
            self.s.proxy.heal_all()
        self._heal_extra()
        self._ensure_services()
        self.stopped_at = time.monotonic()
        self._collect_points()
        self.history.add("phase", phase="faults_stopped")
        return self.stopped_at

    def _heal_extra(self) -> None:
        """End the faults of lanes a subclass adds (tests/chaos/partitions.py)."""

    def stop_supervisor(self) -> None:
        self._supervise_stop.set()
        for thread in self._threads:
            if thread.name == "nemesis-supervisor":
                thread.join(10)

    def _ensure_services(self) -> None:
        if self.s.redis.process is None or self.s.redis.process.poll() is not None:
            self.s.redis.start()
        try:
            self.s.postgres.wait_ready(5)
        except psycopg.OperationalError:
            self.s.postgres.restart_immediate()

    # ------------------------------------------------------------------ the timeline

    def _timeline(self, kinds: tuple[str, ...]) -> list[tuple[float, str]]:
        events = []
        for kind in kinds:
            for _ in range(self.targets.get(kind, 0)):
                events.append((self.rng.uniform(0.02, 0.85) * self.duration, kind))
        events.sort()
        return events

    def _elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def _process_lane(self) -> None:
        timeline = self._timeline(PROCESS_KINDS)
        heapq.heapify(timeline)
        while not self._stop.is_set():
            self._resume_due()
            if not timeline or timeline[0][0] > self._elapsed():
                self._stop.wait(0.05)
                continue
            at, kind = heapq.heappop(timeline)
            if not self._fire_process(kind):
                # Nothing to act on right now (all workers restarting): try again shortly.
                self.counts.skipped[kind] += 1
                heapq.heappush(timeline, (self._elapsed() + 0.5, kind))

    def _fire_process(self, kind: str) -> bool:
        if kind == "kill_child":
            return self._kill_child()
        if kind == "kill_node":
            return self._kill_node()
        if kind == "pause":
            return self._pause()
        return self._terminate(kind[len("pg_terminate_") :])

    # ------------------------------------------------------------------ processes

    def _live_workers(self) -> list[Member]:
        return self.s.fleet.by_role("worker")

    def _ready_workers(self) -> list[Member]:
        """Live, ready and not paused as a whole: the workers that can drain the queue."""
        with self._paused_lock:
            paused = {pid for _, pid, _, group in self._paused if group}
        return [m for m in self._live_workers() if m.pid not in paused and _ready(m)]

    def _busy_children(self) -> list[int]:
        """Pool children that hold a lease right now (the owner token starts with the pid)."""
        children = {pid for m in self._live_workers() for pid in children_of(m.pid)}
        try:
            with psycopg.connect(self.s.postgres.admin_dsn.rsplit("/", 1)[0] + "/" + self.s.database,
                                 connect_timeout=2) as conn:
                tokens = conn.execute(
                    "SELECT owner_token FROM toolfence_operations WHERE state = 'started'"
                ).fetchall()
        except psycopg.Error:
            return []
        busy = set()
        for (token,) in tokens:
            if token and "-" in token:
                pid = int(token.split("-", 1)[0])
                if pid in children:
                    busy.add(pid)
        return sorted(busy)

    def _kill_child(self) -> bool:
        busy = self._busy_children()
        candidates = busy or [pid for m in self._live_workers() for pid in children_of(m.pid)]
        if not candidates:
            return False
        pid = self.rng.choice(candidates)
        self._killed_pids.add(pid)
        self._signal(pid, signal.SIGKILL)
        self.counts.add("kill_child")
        self.history.add("fault", fault="kill_child", pid=pid, busy=pid in busy)
        return True

    def _kill_node(self) -> bool:
        ready = self._ready_workers()
        if len(ready) < max(2, self.workers):
            # A replacement is still starting (seconds on a loaded machine): killing
            # another now would leave the queue to one worker, or none.
            return False
        member = self.rng.choice(ready)
        children = children_of(member.pid)
        self._killed_pids.update([member.pid, *children])
        try:
            os.killpg(member.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.counts.add("kill_node")
        self.history.add("fault", fault="kill_node", pid=member.pid, children=children)
        return True

    def _pause(self) -> bool:
        busy = self._busy_children()
        hold = self.s.lease_seconds + self.s.reconcile_every + 0.5 + self.rng.uniform(0, self.s.lease_seconds)
        roll = self.rng.random()
        if roll < 0.2:
            ready = self._ready_workers()
            if len(ready) < 2:
                return False
            member = self.rng.choice(ready)
            pid, group = member.pid, True
        else:
            candidates = busy or [p for m in self._live_workers() for p in children_of(m.pid)]
            if not candidates:
                return False
            pid, group = self.rng.choice(candidates), False
        try:
            if group:
                os.killpg(pid, signal.SIGSTOP)
            else:
                os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        with self._paused_lock:
            self._paused.append((time.monotonic() + hold, pid, "pause", group))
        self.counts.add("pause")
        self.history.add("fault", fault="pause", pid=pid, whole_worker=group, busy=pid in busy,
                         seconds=round(hold, 2))
        return True

    def _resume_due(self) -> None:
        now = time.monotonic()
        with self._paused_lock:
            due = [p for p in self._paused if p[0] <= now]
            self._paused = [p for p in self._paused if p[0] > now]
        for _, pid, _, group in due:
            self._continue(pid, group)

    def _resume_all(self) -> None:
        with self._paused_lock:
            paused, self._paused = self._paused, []
        for _, pid, _, group in paused:
            self._continue(pid, group)

    def _continue(self, pid: int, group: bool) -> None:
        try:
            if group:
                os.killpg(pid, signal.SIGCONT)
            else:
                os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.history.add("fault_end", fault="pause", pid=pid)

    def _signal(self, pid: int, sig: signal.Signals) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def _terminate(self, role: str) -> bool:
        everyone = self.rng.random() < 0.5
        try:
            with psycopg.connect(self.s.postgres.admin_dsn, autocommit=True, connect_timeout=2) as conn:
                pids = [
                    r[0] for r in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
                        (self.s.database, f"toolfence-{role}"),
                    ).fetchall()
                ]
                if not pids:
                    return False
                chosen = pids if everyone else [self.rng.choice(pids)]
                for pid in chosen:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        except psycopg.Error:
            return False
        self.counts.add(f"pg_terminate_{role}")
        self.history.add("fault", fault=f"pg_terminate_{role}", sessions=len(chosen), of=len(pids))
        return True

    # ------------------------------------------------------------------ infrastructure

    def _infra_lane(self) -> None:
        plan = [kind for kind in INFRA_KINDS for _ in range(self.targets.get(kind, 0))]
        self.rng.shuffle(plan)
        if not plan:
            return
        # Spread the plan over the window, one fault at a time, with the system
        # left alone between them so the faults do not blur into one outage.
        budget = self.duration * 0.85
        busy = sum(self._infra_seconds(kind) for kind in plan)
        gap = max(0.5, (budget - busy) / (len(plan) + 1))
        routes = ["pg", "redis"]
        for index, kind in enumerate(plan):
            if self._stop.wait(gap):
                return
            route = routes[index % 2]
            self._infra_busy.set()
            try:
                self._fire_infra(kind, route)
            finally:
                self._infra_busy.clear()

    def _infra_seconds(self, kind: str) -> float:
        if kind.startswith("net_"):
            return float(kind.rsplit("_", 1)[1][:-1]) * self.s.lease_seconds
        return 1.5

    def _fire_infra(self, kind: str, route: str) -> None:
        if kind == "pg_restart":
            down = self.rng.uniform(0.0, 1.0)
            self.history.add("fault", fault=kind, down_seconds=round(down, 2))
            self.s.postgres.restart_immediate(down_seconds=down)
            self.counts.add(kind)
            self.history.add("fault_end", fault=kind)
            return
        if kind.startswith("redis_restart"):
            # `_off`: the killed server ran without persistence (queued messages are
            # gone); `_aof`: it ran with AOF and comes back with its data.
            aof = kind.endswith("aof")
            if self.s.redis.aof != aof:
                self.s.redis.restart(aof=aof)  # set the mode first; not counted
                self._stop.wait(1.0)
            down = self.rng.uniform(0.0, 0.5)
            self.history.add("fault", fault=kind, down_seconds=round(down, 2))
            self.s.redis.restart(aof=aof, down_seconds=down)
            self.counts.add(kind)
            self.history.add("fault_end", fault=kind)
            return
        _, mode, factor = kind.split("_")
        seconds = float(factor[:-1]) * self.s.lease_seconds
        latency_ms = self.s.lease_seconds * 1000 / 10
        self.history.add("fault", fault=kind, route=route, seconds=seconds,
                         latency_ms=latency_ms if mode == "latency" else None)
        assert self.s.proxy is not None, "network faults through the proxy need the proxy"
        self.s.proxy.set(route, mode, latency_ms)
        self.counts.add(kind)
        self.counts.add(f"net_route_{route}")
        self._stop.wait(seconds)
        self.s.proxy.set(route, "pass")
        self.history.add("fault_end", fault=kind, route=route)

    # ------------------------------------------------------------------ fault points

    # Starting probability per firing opportunity: relays pass a fault point once per
    # published batch (many per second), workers once per operation.
    _INITIAL_PROBABILITY = {"relay_kill_after_publish": 0.005}

    def _init_point_probabilities(self) -> None:
        for kind in POINT_KINDS:
            if self.targets.get(kind, 0):
                self._probabilities[kind] = self._INITIAL_PROBABILITY.get(kind, 0.01)
        self._apply_probabilities()

    def _apply_probabilities(self) -> None:
        specs: dict[str, list[str]] = {"worker": [], "relay": []}
        for kind, probability in self._probabilities.items():
            if probability <= 0:
                continue
            role, point, action = POINT_SPEC[kind]
            specs[role].append(f"{point}={action}@{probability:.4f}")
        self._write_points({role: ",".join(entries) for role, entries in specs.items()})

    def _write_points(self, specs: dict[str, str]) -> None:
        for role, text in specs.items():
            path = self.s.points_file(role)
            if not text:
                path.unlink(missing_ok=True)
                continue
            temporary = path.with_suffix(".tmp")
            temporary.write_text(text)
            os.replace(temporary, path)  # readers see the old spec or the new, never half

    def _points_lane(self) -> None:
        """Pace each fault point along its target, re-steered every second.

        A point is off while it is ahead of its schedule (`target` firings by 85 %
        of the window, at an even rate, and on at that rate past it) and its
        probability grows while it is behind. Without pacing, a point that fires
        per published batch (the relay's) can take both relays down at once.
        """
        active = dict(self._probabilities)
        while not self._stop.wait(1.0):
            self._collect_points()
            progress = self._elapsed() / (0.85 * self.duration)
            for kind, initial in active.items():
                expected = self.targets[kind] * progress
                if self.counts.fired[kind] >= expected + 1:
                    self._probabilities[kind] = 0.0
                else:
                    current = self._probabilities[kind]
                    self._probabilities[kind] = min(0.3, max(initial, current * 1.5))
            self._apply_probabilities()

    def _collect_points(self) -> None:
        """Count new lines of the fault log (each firing wrote one before acting)."""
        path = self.s.fault_log
        if not path.exists():
            return
        with path.open("rb") as handle:
            handle.seek(self._points_offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._points_offset += len(complete)
        for line in complete.decode().splitlines():
            point, tool, action, pid = line.split()
            kind = POINT_KIND_OF.get((point, action), f"point_{point}_{action}")
            if action == "kill":
                self._killed_pids.add(int(pid))
            self.counts.add(kind)
            self.history.add("fault_point", fault=kind, point=point, tool=tool, pid=int(pid))

    # ------------------------------------------------------------------ supervisor

    def _supervisor(self) -> None:
        """Replace dead workers and relays; record deaths nobody asked for.

        Runs until `stop_supervisor()`, past the chaos window: a worker killed just
        before the faults stopped must still be replaced while the fleet drains.
        """
        fleet = self.s.fleet
        while not self._supervise_stop.is_set():
            for member in list(fleet.members):
                if member.alive() or member.pid in self._seen_dead:
                    continue
                self._seen_dead.add(member.pid)
                self._collect_points()
                if member.pid not in self._killed_pids:
                    self.history.add("member_exit", role=member.role, pid=member.pid,
                                     returncode=member.process.returncode, log=str(member.log_path),
                                     reason=_exit_reason(member))
            for _ in range(self.workers - len(fleet.by_role("worker"))):
                fleet.start_worker(self._worker_index)
                self._worker_index += 1
                self.counts.add("worker_replaced")
            for _ in range(self.relays - len(fleet.by_role("relay"))):
                fleet.start_relay(self._relay_index)
                self._relay_index += 1
                self.counts.add("relay_replaced")
            if not fleet.by_role("reconciler"):
                fleet.start_reconciler()
                self.counts.add("reconciler_replaced")
            self._supervise_stop.wait(0.3)

    # ------------------------------------------------------------------ report

    def summary(self) -> dict[str, Any]:
        fired = dict(self.counts.fired)
        shortfall = {
            kind: {"asked": asked, "fired": fired.get(kind, 0)}
            for kind, asked in self.targets.items()
            if fired.get(kind, 0) < asked
        }
        return {
            "fired": dict(sorted(fired.items())),
            "targets": dict(sorted(self.targets.items())),
            "shortfall": shortfall,
            "skipped": dict(self.counts.skipped),
            "final_probabilities": {k: round(v, 4) for k, v in self._probabilities.items()},
            "errors": self.errors,
        }
