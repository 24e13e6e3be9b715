"""Test-only fault points, switched on by `TOOLFENCE_FAULT_POINTS` (never in production).

Syntax: comma-separated `point[:tool]=action[@probability]`, e.g.
`after_effect:ledger.create_invoice=kill`, `reserve_commit=ambiguous@0.2`.
Actions: `kill` (SIGKILL this process), `sleep<seconds>` (e.g. `sleep2.5`),
`ambiguous` (raise a connection error after the statement committed).

Two more variables serve the chaos campaign (tests/chaos), which must switch
faults on and off in running processes and count every firing:
`TOOLFENCE_FAULT_POINTS_FILE` names a file holding the same syntax (comma or
newline separated); it replaces the variable and is re-read when it changes,
and a missing file means no faults. `TOOLFENCE_FAULT_LOG` names a file to which
each firing appends one line, `point tool action pid`, *before* it acts (a kill
leaves no chance afterwards).
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass

from executor.errors import WorkerError
from executor.settings import Settings


class AmbiguousCommit(WorkerError, ConnectionError):
    """The statement committed, but the caller is told the connection failed."""


@dataclass(frozen=True)
class FaultPoint:
    point: str
    tool: str | None
    action: str
    probability: float


def parse(spec: frozenset[str]) -> list[FaultPoint]:
    points = []
    for entry in spec:
        target, _, action = entry.partition("=")
        point, _, tool = target.partition(":")
        action, _, probability = action.partition("@")
        points.append(FaultPoint(point, tool or None, action or "kill", float(probability or 1.0)))
    return points


class Faults:
    def __init__(self, settings: Settings) -> None:
        self._points = parse(settings.fault_points)
        self._file = settings.fault_points_file
        self._file_stamp: tuple[float, int] | None = None
        self._log = settings.fault_log
        if self._file:
            self._points = []
            self._reload()

    def __bool__(self) -> bool:
        return bool(self._points) or self._file is not None

    def _reload(self) -> None:
        """Re-read the points file when its mtime or size changed (one stat per call)."""
        assert self._file is not None
        try:
            stat = os.stat(self._file)
        except FileNotFoundError:
            self._points, self._file_stamp = [], None
            return
        stamp = (stat.st_mtime, stat.st_size)
        if stamp == self._file_stamp:
            return
        try:
            with open(self._file, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            self._points, self._file_stamp = [], None
            return
        entries = frozenset(e.strip() for e in text.replace("\n", ",").split(",") if e.strip())
        self._points, self._file_stamp = parse(entries), stamp

    def _record(self, fault: FaultPoint, tool: str | None) -> None:
        if self._log is None:
            return
        line = f"{fault.point} {tool or '-'} {fault.action} {os.getpid()}\n".encode()
        # One O_APPEND write per line: concurrent processes never interleave inside one.
        descriptor = os.open(self._log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)

    def fire(self, point: str, tool: str | None = None) -> None:
        if self._file is not None:
            self._reload()
        for fault in self._points:
            if fault.point != point or (fault.tool and fault.tool != tool):
                continue
            if random.random() >= fault.probability:
                continue
            self._record(fault, tool)
            if fault.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault.action.startswith("sleep"):
                time.sleep(float(fault.action[len("sleep") :] or 1.0))
            elif fault.action == "ambiguous":
                raise AmbiguousCommit(f"fault point {point}: connection lost after commit")
