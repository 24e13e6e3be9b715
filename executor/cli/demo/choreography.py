"""The run: waves of requests, the kill and the pause, watched live."""

from __future__ import annotations

import json
import os
import platform
import signal
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from sqlalchemy import Engine, func, or_, select

from executor import store
from executor.cli.demo.constants import (
    APPROVER,
    DENIER,
    POLL_SECONDS,
    RECONCILE_EVERY_SECONDS,
    STEADY_QUEUED,
    STOP,
    pause,
)
from executor.cli.demo.place import Place
from executor.cli.demo.workload import PETTY_CASH, TENANTS, DemoRequest
from executor.cli.fleet import Fleet, Member, children_of
from executor.core.states import SETTLED, ApprovalState, State
from executor.store.engine import make_engine, read_only
from executor.store.migrate import migrate
from executor.store.schema import approvals, calls, operations


@dataclass(frozen=True)
class Snapshot:
    states: Mapping[str, int]  # operations per state
    settled_calls: int  # calls with a stored result, or whose operation has settled

    @property
    def busy(self) -> int:
        return sum(
            self.states.get(s.value, 0)
            for s in (State.QUEUED, State.STARTED, State.RETRY_WAIT, State.PENDING_APPROVAL)
        )

    def summary(self) -> str:
        parts = [
            f"{label} {self.states.get(state.value, 0)}"
            for label, state in (
                ("queued", State.QUEUED), ("running", State.STARTED), ("retrying", State.RETRY_WAIT),
                ("awaiting approval", State.PENDING_APPROVAL),
            )
            if self.states.get(state.value, 0)
        ]
        return " · ".join(parts) or "idle"


def snapshot(reader: Engine) -> Snapshot:
    with reader.connect() as conn:
        states: dict[str, int] = {
            str(state): int(count)
            for state, count in conn.execute(
                select(operations.c.state, func.count()).group_by(operations.c.state)
            ).all()
        }
        # Counted by call, not by operation: a repeated write's call row points at the
        # earlier call's operation, and is settled when that one is.
        settled = conn.execute(
            select(func.count())
            .select_from(
                calls.outerjoin(operations, operations.c.operation_id == calls.c.operation_id)
            )
            .where(
                or_(
                    calls.c.result.is_not(None),
                    operations.c.state.in_([s.value for s in SETTLED]),
                )
            )
        ).scalar_one()
    return Snapshot(states, int(settled))


@dataclass(frozen=True)
class Owned:
    """An operation a worker's pool child holds right now."""

    operation_id: str
    tool_name: str
    generation: int


def owned_by(reader: Engine, pid: int) -> Owned | None:
    # Owner tokens start with the pid of the process that reserved (executor.worker.runner).
    with reader.connect() as conn:
        row = conn.execute(
            select(operations.c.operation_id, operations.c.tool_name, operations.c.generation)
            .where(operations.c.state == State.STARTED.value, operations.c.owner_token.like(f"{pid}-%"))
            .limit(1)
        ).first()
    return None if row is None else Owned(row.operation_id, row.tool_name, int(row.generation))


def ledger_effect_exists(reader: Engine, operation_id: str) -> bool:
    from ledger.service import effects

    with reader.connect() as conn:
        return conn.execute(
            select(effects.c.receipt).where(effects.c.operation_id == operation_id).limit(1)
        ).first() is not None


_SLEEP_SYSCALLS = {"x86_64": {"35", "230"}, "aarch64": {"101", "115"}}.get(platform.machine(), set())


def sleeping(pid: int) -> bool:
    """Is the process's main thread in nanosleep? For a pool child running a write that is
    the downstream call (the ledger's latency) or a wait for SQLite's write lock, never a
    moment when it holds a transaction open."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split(" ", 1)[0] in _SLEEP_SYSCALLS
    except OSError:
        return False


def pool_child(member: Member) -> int | None:
    children = children_of(member.pid)
    return children[0] if children else None


def worker_ready(member: Member) -> bool:
    return member.said("toolfence worker ready")


# ---------------------------------------------------------------------- the run


@dataclass
class Approvals:
    """The demo's approver: denies the one request it is meant to deny, approves the rest."""

    deny_request: str | None
    decided: set[str] = field(default_factory=set)
    seen_at: dict[str, float] = field(default_factory=dict)


@dataclass
class Paused:
    """What the paused worker held, and what became of it."""

    owned: Owned | None = None
    seconds: float = 0.0
    fence_reported: bool = False


class DemoRun:
    def __init__(
        self, console: Console, place: Place, requests: Sequence[DemoRequest], workers: int,
        lease_seconds: float,
    ) -> None:
        self.console = console
        self.place = place
        self.total_calls = sum(len(r.calls) for r in requests)
        self.lease_seconds = lease_seconds
        self.engine = make_engine(place.database_url)
        self.reader = read_only(self.engine)
        self.fleet = Fleet(
            env=place.fleet_env(lease_seconds), log_dir=place.run_dir / "logs", workers=workers,
            concurrency=1, reconcile_every=RECONCILE_EVERY_SECONDS,
        )
        denied = next((r for r in requests if r.kind == "approval" and r.tenant == "globex"), None)
        self.approvals = Approvals(denied.request_id if denied else None)
        self.paused = Paused()
        self.accounted_for: set[int] = set()  # processes whose exit is explained (we killed them)
        self.unplanned_exits = 0
        self.feeding: deque[DemoRequest] = deque()  # requests that arrive as the fleet keeps up
        self.progress: Progress | None = None
        self.task_id: Any = None
        self._last_tick = 0.0
        self._last_plain = 0.0
        self.started_at = time.monotonic()

    # -------------------------------------------------------------- output

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress.console.print(message)
        else:
            self.console.print(message)

    def fault(self, message: str) -> None:
        self.say(f"[bold red]⚡[/] [dim]{time.monotonic() - self.started_at:5.1f} s[/] {message}")

    def tick(self, force: bool = False) -> Snapshot | None:
        """Refresh progress, decide approvals, replace crashed processes: every POLL_SECONDS."""
        STOP.check()
        now = time.monotonic()
        if not force and now - self._last_tick < POLL_SECONDS:
            return None
        self._last_tick = now
        self._replace_crashed()
        self._decide_approvals()
        self._report_fence()
        snap = snapshot(self.reader)
        if self.feeding:
            self._feed(snap)
        if self.progress is not None:
            self.progress.update(self.task_id, completed=snap.settled_calls, detail=snap.summary())
            if not self.console.is_terminal and now - self._last_plain >= 5.0:
                self._last_plain = now
                self.console.print(
                    f"  {snap.settled_calls}/{self.total_calls} calls settled · {snap.summary()}"
                )
        return snap

    def _replace_crashed(self) -> None:
        """A process that exits on its own is reported and replaced, never hidden.

        (The filesystem transport can hand a consumer a message file the relay has
        created but not yet written, and Celery treats that as unrecoverable:
        celery/kombu#1551. The reconciler republishes the message it lost.)"""
        for member in list(self.fleet.members):
            if member.alive() or member.pid in self.accounted_for:
                continue
            self.accounted_for.add(member.pid)
            self.unplanned_exits += 1
            if member.role == "worker":
                replacement = self.fleet.start_worker(self._next_worker_index())
            elif member.role == "relay":
                replacement = self.fleet.start_relay(member.index)
            else:
                replacement = self.fleet.start_reconciler()
            self.say(
                f"[yellow]![/] {member.role} {member.index} (pid {member.pid}) exited on its own with "
                f"status {member.process.returncode} (see {member.log_path}); started pid "
                f"{replacement.pid} in its place"
            )

    def start_fleet(self) -> None:
        """Relay, workers and reconciler; the first worker alone until it is ready.

        Two workers starting at once on the filesystem transport can both create its
        exchange table file, and one then reads it empty and dies (the same kombu race
        as celery/kombu#1551). Once the first worker has written the tables, the
        others only read and extend them under a lock.
        """
        self.fleet.start_relay(0)
        self.fleet.start_worker(0)
        self.fleet.wait_ready(90.0)
        for index in range(1, self.fleet.workers):
            self.fleet.start_worker(index)
        self.fleet.start_reconciler()
        self.fleet.wait_ready(90.0)

    def _next_worker_index(self) -> int:
        # Distinct from every worker started so far: its log file and Celery node name.
        return sum(1 for m in self.fleet.members if m.role == "worker")

    # -------------------------------------------------------------- setup

    def setup(self) -> None:
        from ledger.service import Ledger

        migrate(self.place.database_url)
        ledger = Ledger(self.place.database_url, latency_seconds=0.0)
        ledger.create_schema()
        for tenant, accounts in TENANTS.items():
            for account_id, cents in accounts.items():
                ledger.open_account(account_id, tenant, cents)
        account_id, tenant, cents = PETTY_CASH
        ledger.open_account(account_id, tenant, cents)
        ledger.engine.dispose()

    def enqueue(self, wave: Sequence[DemoRequest]) -> None:
        for request in wave:
            self._enqueue_one(request)
            self.tick()

    def _enqueue_one(self, request: DemoRequest) -> None:
        from ledger.tools import registry
        from outbox.producer import enqueue

        # One transaction per request, as a producer writes its own business rows in it too.
        with self.engine.begin() as conn:
            enqueue(conn, request.calls, request.context, registry)

    def feed(self, wave: Sequence[DemoRequest]) -> None:
        """Let `wave` arrive as the fleet keeps up, from every tick: at most STEADY_QUEUED
        operations queued, so a message the reconciler republishes is not stuck behind
        a long queue while a worker is paused."""
        self.feeding.extend(wave)

    def _feed(self, snap: Snapshot) -> None:
        room = STEADY_QUEUED - snap.states.get(State.QUEUED.value, 0)
        while self.feeding and room > 0:
            request = self.feeding.popleft()
            self._enqueue_one(request)
            room -= len(request.calls)

    def finish_feeding(self) -> None:
        while self.feeding:
            self.tick(force=True)
            pause(POLL_SECONDS)

    # -------------------------------------------------------------- approvals

    def _decide_approvals(self) -> None:
        with self.reader.connect() as conn:
            pending = conn.execute(
                select(approvals.c.approval_id, approvals.c.impact, operations.c.request_id,
                       operations.c.tool_name)
                .join(operations, operations.c.operation_id == approvals.c.operation_id)
                .where(approvals.c.state == ApprovalState.PENDING)
            ).all()
        now = time.monotonic()
        for row in pending:
            if row.approval_id in self.approvals.decided:
                continue
            if row.approval_id not in self.approvals.seen_at:
                self.approvals.seen_at[row.approval_id] = now
                impact = json.loads(row.impact)
                self.say(
                    f"[bold yellow]✋ approval requested[/] {row.approval_id} for {row.tool_name}: "
                    f"{impact.get('summary', impact)}"
                )
                continue
            if now - self.approvals.seen_at[row.approval_id] < 1.0:
                continue  # let a person (the newcomer watching) see it pending first
            from ledger.tools import registry

            with self.engine.begin() as conn:
                if row.request_id == self.approvals.deny_request:
                    decision = store.deny(
                        conn, row.approval_id, approver=DENIER, registry=registry,
                        reason="over the weekly limit",
                    )
                    verdict = f"[red]denied[/] by {DENIER.principal} (store.deny)"
                else:
                    decision = store.approve(conn, row.approval_id, approver=APPROVER, registry=registry)
                    verdict = f"[green]approved[/] by {APPROVER.principal} (store.approve)"
            self.approvals.decided.add(row.approval_id)
            if decision.decided:
                self.say(f"[bold yellow]✋[/] {row.approval_id} {verdict}")

    # -------------------------------------------------------------- faults

    def _catch(
        self, member: Member, prefer: Sequence[Sequence[str]], patience: float,
        remaining_work: Any,
    ) -> tuple[int | None, Owned | None]:
        """Wait until the member's pool child is inside a downstream call of a preferred tool.

        `prefer` lists tool sets from most to least wanted; each later set is accepted
        after another `patience` seconds. Gives up (returns no operation) once the work
        that could be caught has all settled.
        """
        started = time.monotonic()
        while True:
            child = pool_child(member)
            elapsed = time.monotonic() - started
            level = min(int(elapsed // patience), len(prefer) - 1)
            wanted = {tool for group in prefer[: level + 1] for tool in group}
            if child is not None and sleeping(child):
                owned = owned_by(self.reader, child)
                if (
                    owned is not None and owned.tool_name in wanted
                    and not ledger_effect_exists(self.reader, owned.operation_id)
                ):
                    return child, owned
            snap = self.tick()
            if snap is not None and not remaining_work(snap):
                return child, None
            pause(0.002)

    def kill_one(self) -> Member | None:
        workers = self.fleet.by_role("worker")
        if not workers:
            return None
        victim = workers[0]
        child, owned = self._catch(
            victim,
            prefer=[("ledger.send_notice",), ("ledger.create_invoice", "ledger.credit", "ledger.transfer")],
            patience=6.0,
            remaining_work=lambda snap: snap.busy > 0 or bool(self.feeding),
        )
        self.accounted_for.add(victim.pid)
        os.killpg(victim.pid, signal.SIGKILL)
        holding = (
            f"while it was inside {owned.tool_name} {owned.operation_id} (generation {owned.generation})"
            if owned else "while it was idle"
        )
        self.fault(f"SIGKILL worker {victim.index} (pid {victim.pid}, pool child {child}) {holding}")
        if owned and owned.tool_name == "ledger.send_notice":
            self.say(
                "   an unsafe write with an unknown outcome: the reconciler will hand it to a person "
                "(reconciliation_pending), never retry it"
            )
        replacement = self.fleet.start_worker(self._next_worker_index())
        self.say(f"   started replacement worker {replacement.index} (pid {replacement.pid})")
        return replacement

    def pause_one(self, replacement: Member | None) -> None:
        """SIGSTOP a worker inside a fenced write; SIGCONT it once a new generation finished it."""
        while replacement is not None and replacement.alive() and not worker_ready(replacement):
            self.tick()
            pause(0.05)
        if replacement is not None:
            self.say(f"   replacement worker {replacement.index} is ready")
        candidates = [m for m in self.fleet.by_role("worker") if m is not replacement] or [
            m for m in self.fleet.by_role("worker")
        ]
        if not candidates:
            return
        victim = candidates[0]
        takeover_tools = ("ledger.transfer",), ("ledger.credit",), ("ledger.get_balance",)
        child, owned = self._catch(
            victim, prefer=takeover_tools, patience=4.0,
            remaining_work=lambda snap: snap.busy > 0 or bool(self.feeding),
        )
        if owned is None and child is not None and not self._idle(child):
            self.say("   no safe moment to pause a worker (it never sat in a downstream call); skipped")
            return
        os.killpg(victim.pid, signal.SIGSTOP)
        paused_at = time.monotonic()
        self.paused.owned = owned
        holding = (
            f"inside {owned.tool_name} {owned.operation_id} (generation {owned.generation})"
            if owned else "while idle"
        )
        self.fault(
            f"SIGSTOP worker {victim.index} (pid {victim.pid}) {holding}; "
            f"keeping it stopped past its {self.lease_seconds:g} s lease"
        )
        self._resume_after_takeover(victim, owned, paused_at)

    def _idle(self, child: int) -> bool:
        """A pool child waiting for work holds no transaction: safe to stop."""
        return owned_by(self.reader, child) is None and not sleeping(child)

    def _resume_after_takeover(self, victim: Member, owned: Owned | None, paused_at: float) -> None:
        minimum = self.lease_seconds + 0.5
        maximum = max(3 * self.lease_seconds, self.lease_seconds + 12.0)
        taken_over: Any = None
        while True:
            elapsed = time.monotonic() - paused_at
            if owned is not None and taken_over is None:
                with self.reader.connect() as conn:
                    row = store.get_operation(conn, owned.operation_id)
                if row is not None and row.generation > owned.generation and row.state in (
                    State.SUCCEEDED.value, State.FAILED_TERMINAL.value
                ):
                    taken_over = row
            done = owned is None or taken_over is not None
            if (elapsed >= minimum and done) or elapsed >= maximum:
                break
            self.tick()
            pause(0.02)
        os.killpg(victim.pid, signal.SIGCONT)
        self.paused.seconds = time.monotonic() - paused_at
        detail = ""
        if owned is not None and taken_over is not None:
            detail = (
                f": meanwhile generation {taken_over.generation} took {owned.operation_id} over and "
                f"it {taken_over.state}; the paused worker still holds generation {owned.generation}"
            )
        elif owned is not None:
            detail = f": {owned.operation_id} was not taken over in time"
        self.fault(f"SIGCONT worker {victim.index} after {self.paused.seconds:.1f} s{detail}")

    def _report_fence(self) -> None:
        paused = self.paused.owned
        if paused is None or self.paused.fence_reported or not self.paused.seconds:
            return
        from ledger.service import fenced_writes

        with self.reader.connect() as conn:
            row = conn.execute(
                select(fenced_writes.c.token, fenced_writes.c.highest_token)
                .where(fenced_writes.c.operation_id == paused.operation_id)
                .limit(1)
            ).first()
        if row is not None:
            self.paused.fence_reported = True
            self.say(
                f"   the ledger refused the resumed worker's write: fencing token {row.token} "
                f"< {row.highest_token} already seen for {paused.operation_id}"
            )

    # -------------------------------------------------------------- waiting

    def wait_until_quiet(self, timeout: float, stalled_after: float) -> bool:
        """Until every call is settled and nothing runs; False after `timeout`, or once
        nothing has changed for `stalled_after` seconds (longer than the reconciler
        takes to republish a lost message)."""
        deadline = time.monotonic() + timeout
        last_change, last_seen = time.monotonic(), None
        quiet_polls = 0
        while time.monotonic() < deadline and time.monotonic() - last_change < stalled_after:
            snap = self.tick(force=True)
            assert snap is not None
            if snap != last_seen:
                last_change, last_seen = time.monotonic(), snap
            if snap.settled_calls >= self.total_calls and snap.busy == 0:
                quiet_polls += 1
                if quiet_polls >= 2:  # twice in a row: nothing moved in between
                    return True
            else:
                quiet_polls = 0
            pause(POLL_SECONDS)
        return False


# ---------------------------------------------------------------------- the evidence
