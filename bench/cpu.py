"""Where a benchmark row's CPU goes: every process's CPU time in the timed window,
by role (worker main process, pool child, relay, PostgreSQL's backends and its own
upkeep, broker, this script; "other" is everything else on the machine, another
job's processes included).

The machine total (`busy_seconds`, from /proc/stat) says how much a row cost; the
split says who paid it. On a two-core machine every fleet row is CPU-bound, so a
ratio between two rows is a ratio of CPU per operation, and the split is what
tells toolfence's own cost (the pool child, PostgreSQL) from the worker's main
process, which runs only Celery's and kombu's code (the broker's delivery and
acknowledgement, the hand-off to the pool).

Linux only (/proc). A process that starts and ends inside the window is missed;
the benchmark's processes all outlive their windows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROLES = (
    "worker main", "pool child", "relay", "PostgreSQL", "PostgreSQL background", "broker", "benchmark",
    "other",
)
# A backend serves a connection; the rest (autovacuum, WAL writer, checkpointer, ...) is
# the server's own upkeep, which a row may owe to the rows written before it.
_POSTGRES_BACKEND = "postgres: "
_POSTGRES_CLIENT = re.compile(r" (\S+\(\d+\)|\[local\]) ")  # host(port) or [local]
_WORKER_MARKERS = ("celery", "executor.cli worker", "dbos_worker.py")
_BROKER_MARKERS = ("redis-server", "beam.smp", "rabbitmq")
_RELAY_MARKERS = ("executor.cli relay", "bench.plain_outbox relay")


@dataclass(frozen=True)
class Process:
    command: str
    parent: int
    ticks: int  # user + system, in clock ticks
    started: int = 0  # clock ticks after boot: with the pid, who the process is


def busy_seconds() -> float:
    """CPU time the whole machine has spent busy since boot (every process and the
    kernel: workers, PostgreSQL, the broker, this script), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def processes() -> dict[int, Process]:
    """Every process now: its command line (or name), parent and CPU ticks."""
    found: dict[int, Process] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        name, rest = stat.split(" (", 1)[1].rsplit(")", 1)
        fields = rest.split()
        # After the name: state, ppid, ...; utime, stime and starttime are stat's 14th,
        # 15th and 22nd fields.
        found[int(entry.name)] = Process(
            command.strip() or name, int(fields[1]), int(fields[11]) + int(fields[12]),
            int(fields[19]),
        )
    return found


def role_of(pid: int, table: Mapping[int, Process], me: int) -> str:
    process = table[pid]
    if pid == me:
        return "benchmark"
    command = process.command
    if any(marker in command for marker in _RELAY_MARKERS):
        return "relay"
    if any(marker in command for marker in _WORKER_MARKERS):
        parent = table.get(process.parent)
        if parent is not None and any(marker in parent.command for marker in _WORKER_MARKERS):
            return "pool child"
        return "worker main"
    if command.startswith(_POSTGRES_BACKEND):
        # "postgres: 15/main: <user> <database> <client> <status>" for a backend,
        # "postgres: 15/main: autovacuum worker" and the like for the server's own.
        return "PostgreSQL" if _POSTGRES_CLIENT.search(command) else "PostgreSQL background"
    if "/postgres" in command.split(" ", 1)[0]:
        return "PostgreSQL background"
    if any(marker in command for marker in _BROKER_MARKERS):
        return "broker"
    return "other"


def split(before: Mapping[int, Process], after: Mapping[int, Process], me: int) -> dict[str, float]:
    """CPU seconds spent between two snapshots, by role. A process new in `after`
    (or a pid reused by a process started since) counts from zero: it started
    inside the window. Identity is the pid and start time, not the command line,
    which a PostgreSQL backend rewrites with every statement."""
    tick = os.sysconf("SC_CLK_TCK")
    spent = dict.fromkeys(ROLES, 0.0)
    for pid, process in after.items():
        earlier = before.get(pid)
        start = earlier.ticks if earlier is not None and earlier.started == process.started else 0
        spent[role_of(pid, after, me)] += max(0, process.ticks - start) / tick
    return spent


class Window:
    """`start()` at the row's clock start, `stop()` at its end: the machine's busy
    seconds and their split by role."""

    def __init__(self) -> None:
        self._busy = 0.0
        self._before: dict[int, Process] = {}
        self.busy = 0.0
        self.by_role: dict[str, float] = {}

    def start(self) -> Window:
        self._before = processes()
        self._busy = busy_seconds()
        return self

    def stop(self) -> Window:
        self.busy = busy_seconds() - self._busy
        self.by_role = split(self._before, processes(), os.getpid())
        return self
