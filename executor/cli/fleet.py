"""Start and stop a real fleet (relay, workers, reconciler) as subprocesses.

Used by `toolfence demo`, the integration and chaos tests and the benchmarks, so
all of them exercise the same commands an operator runs. Every process is
started in its own session and is killed on `stop()`, also after Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Member:
    role: str
    index: int
    process: subprocess.Popen[bytes]
    log_path: Path
    # Where this member's output begins: the log is appended to, and a member started
    # again under the same role and index (or a fleet started again in the same
    # directory) writes after an earlier process's lines, "ready" among them.
    log_start: int = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        """What this member has written to its log, not what earlier processes did."""
        with self.log_path.open("rb") as log:
            log.seek(self.log_start)
            return log.read().decode(errors="replace")

    def said(self, line: str) -> bool:
        try:
            return line in self.log_text()
        except OSError:
            return False

    def alive(self) -> bool:
        return self.process.poll() is None


def children_of(pid: int) -> list[int]:
    """Direct children of a process, from /proc (a prefork worker's pool)."""
    found: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    try:
        for task in task_dir.iterdir():
            text = (task / "children").read_text().split()
            found.extend(int(p) for p in text)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return found


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while a child is started and recorded, then deliver them.

    A handler that raises (Python's default Ctrl-C, as under pytest or the chaos
    campaign) inside `Popen` after the fork, or between `Popen` returning and the
    member being recorded, would leave a process that `stop()` never hears of: a
    worker and its pool child outliving its caller. The demo's own handler no
    longer raises here (it raises only inside `pause()`), but a Fleet must not
    depend on its caller's handler. Only the main thread runs Python signal
    handlers, so only it needs this.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in _INTERRUPTS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for signum in caught[:1]:
            signal.raise_signal(signum)


@dataclass
class Fleet:
    env: Mapping[str, str]
    log_dir: Path
    workers: int = 2
    concurrency: int = 1
    pool: str = "prefork"
    reconcile_every: float | None = 1.0
    relays: int = 1
    # Extra environment per role ("worker", "relay", "reconciler"), over `env`: the
    # chaos campaign routes workers through its proxy and names each role's
    # database sessions (`application_name`) so it can terminate them by role.
    role_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Per member (role, index): a command prefix and more environment. The partitions
    # campaign (tests/chaos/partitions.py) runs each member in a network namespace of
    # its own (`ip netns exec NAME`, which execs in place: the pid stays the member's)
    # under a clock it can skew.
    launcher: Callable[[str, int], tuple[Sequence[str], Mapping[str, str]]] | None = None
    members: list[Member] = field(default_factory=list)

    def _spawn(self, role: str, index: int, args: list[str]) -> Member:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{role}-{index}.log"
        log = log_path.open("ab")
        log_start = log.tell()
        prefix, extra = self.launcher(role, index) if self.launcher else ((), {})
        env = {**os.environ, **self.env, **self.role_env.get(role, {}), **extra, "PYTHONUNBUFFERED": "1"}
        with _interrupts_deferred():
            try:
                process = subprocess.Popen(
                    [*prefix, sys.executable, "-m", "executor.cli", *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            finally:
                log.close()
            member = Member(role, index, process, log_path, log_start)
            self.members.append(member)
        return member

    def start_worker(self, index: int | None = None) -> Member:
        index = index if index is not None else len(self.by_role("worker"))
        return self._spawn(
            "worker", index,
            ["worker", "--concurrency", str(self.concurrency), "--pool", self.pool,
             "--name", f"w{index}-{os.getpid()}@%h"],
        )

    def start_relay(self, index: int | None = None) -> Member:
        index = index if index is not None else len(self.by_role("relay"))
        return self._spawn("relay", index, ["relay"])

    def start_reconciler(self) -> Member:
        return self._spawn("reconciler", 0, ["reconcile", "--every", str(self.reconcile_every)])

    def start(self, *, wait_ready: float = 30.0) -> Fleet:
        for i in range(self.relays):
            self.start_relay(i)
        for i in range(self.workers):
            self.start_worker(i)
        if self.reconcile_every:
            self.start_reconciler()
        self.wait_ready(wait_ready)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Workers are ready when their pool children exist (prefork) and they say so;
        relays when they have tried the broker once (connected, or said it is not
        reachable yet) and are about to make their first pass."""
        deadline = time.monotonic() + timeout
        for role in ("worker", "relay"):
            for member in self.by_role(role):
                while time.monotonic() < deadline:
                    # The line first: a member that said it was ready was, whatever
                    # happened next (a relay started to die at a fault point).
                    if member.said(f"toolfence {role} ready"):
                        break
                    if not member.alive():
                        raise RuntimeError(f"{role} {member.index} exited: see {member.log_path}")
                    time.sleep(0.1)
                else:
                    raise RuntimeError(f"{role} {member.index} not ready after {timeout}s")

    def by_role(self, role: str) -> list[Member]:
        return [m for m in self.members if m.role == role and m.alive()]

    def worker_children(self) -> dict[int, list[int]]:
        return {m.pid: children_of(m.pid) for m in self.by_role("worker")}

    def signal(self, pid: int, sig: signal.Signals) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 10.0) -> None:
        for member in self.members:
            if member.alive():
                try:
                    os.killpg(member.pid, signal.SIGCONT)
                    os.killpg(member.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for member in self.members:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                member.process.wait(remaining)
            except subprocess.TimeoutExpired:
                pass
        for member in self.members:
            # Whatever did not stop in time, and any orphaned pool children.
            try:
                os.killpg(member.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                member.process.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def logs(self) -> str:
        return "\n".join(
            f"===== {m.log_path.name}\n{m.log_path.read_text(errors='replace')[-4000:]}"
            for m in self.members
            if m.log_path.exists()
        )


@contextmanager
def fleet_environment(values: Mapping[str, str]) -> Iterator[None]:
    """This process reads the same settings as the fleet it starts (the demo's and an
    eval run's producer side): `values` over the environment, restored afterwards."""
    from executor.settings import Settings, using

    saved = os.environ.copy()
    os.environ.update(values)
    try:
        with using(Settings.from_env()):
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved)

