"""Test-only fault points, switched on by `TOOLFENCE_FAULT_POINTS` (never in production).

Syntax: comma-separated `point[:tool]=action[@probability]`, e.g.
`after_effect:ledger.create_invoice=kill`, `reserve_commit=ambiguous@0.2`.
Actions: `kill` (SIGKILL this process), `sleep<seconds>` (e.g. `sleep2.5`),
`ambiguous` (raise a connection error after the statement committed).
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass

from executor.settings import Settings


class AmbiguousCommit(ConnectionError):
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

    def __bool__(self) -> bool:
        return bool(self._points)

    def fire(self, point: str, tool: str | None = None) -> None:
        for fault in self._points:
            if fault.point != point or (fault.tool and fault.tool != tool):
                continue
            if random.random() >= fault.probability:
                continue
            if fault.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault.action.startswith("sleep"):
                time.sleep(float(fault.action[len("sleep") :] or 1.0))
            elif fault.action == "ambiguous":
                raise AmbiguousCommit(f"fault point {point}: connection lost after commit")
