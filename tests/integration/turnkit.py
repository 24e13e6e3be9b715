"""Helpers for the turn tests: scripts, a prompt-recording driver, and a manual fleet.

`drive()` plays the fleet in this process: the real `TurnRunner` for the turn
job, the real `OperationRunner` for every queued operation, the real
`Reconciler` sweep (which wakes a turn whose approvals were decided), until the
turn ends or waits for a person. Each step of it is one the worker or the
reconciler would take; only the broker is left out (the outbox rows they would
publish are read straight from the database).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from executor.core.states import State
from executor.core.tools import Registry
from executor.providers.hosted import HostedPolicy
from executor.settings import Settings
from executor.store.schema import operations, turns
from executor.telemetry import logcontext
from executor.turns.drivers import Driver, ScriptedDriver
from executor.turns.specs import load_driver
from executor.turns.values import ModelRequest, ModelResponse
from executor.worker.runner import OperationRunner
from executor.worker.turns import TurnRunner
from reconciler.sweep import Reconciler


def write_script(path: Path, lines: Sequence[Any]) -> Path:
    """One JSONL line per model call: a dict is the JSON contract, a str the raw text."""
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def calls(tool: str, call_id: str = "c1", **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": tool, "arguments": arguments}]}


@dataclass
class Recording:
    """Every request a driver was given (prompts stay in the test, never in the store)."""

    requests: list[ModelRequest] = field(default_factory=list)
    # The correlation ids the turn job's log records carried at each model call.
    log_ids: list[dict[str, str | int]] = field(default_factory=list)

    def factory(self, wrap: Callable[[str], Driver] = load_driver) -> Callable[[str], Driver]:
        recording = self

        @dataclass(frozen=True)
        class _Recorded:
            inner: Driver

            @property
            def mode(self) -> str:
                return self.inner.mode

            def call(self, request: ModelRequest) -> ModelResponse:
                recording.requests.append(request)
                recording.log_ids.append(dict(logcontext.current()))
                return self.inner.call(request)

        return lambda spec: _Recorded(wrap(spec))

    def prompts(self, purpose: str = "turn") -> list[str]:
        return [r.prompt for r in self.requests if r.purpose == purpose]


def asked(script: Path) -> dict[tuple[str, int], int]:
    """How many times each (purpose, call index) was asked, from the script's call log."""
    counts: dict[tuple[str, int], int] = {}
    for entry in ScriptedDriver(script).calls_path.read_text().splitlines():
        data = json.loads(entry)
        key = (data["purpose"], data["call_index"])
        counts[key] = counts.get(key, 0) + 1
    return counts


def turn_state(engine: Engine, turn_id: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(select(turns.c.state).where(turns.c.turn_id == turn_id)).scalar_one())


def drive(
    engine: Engine,
    settings: Settings,
    registry: Registry,
    turn_id: str,
    *,
    drivers: Callable[[str], Driver] = load_driver,
    rounds: int = 40,
    hosted_policy: HostedPolicy | None = None,
) -> str:
    """Run the turn, its operations and the reconciler until the turn ends or waits.
    `hosted_policy`: the application's (TOOLFENCE_HOSTED_POLICY's when None)."""
    turn_runner = TurnRunner(settings, registry, engine, drivers=drivers, hosted_policy=hosted_policy)
    op_runner = OperationRunner(settings, registry, engine)
    reconciler = Reconciler(settings, engine, registry)
    for _ in range(rounds):
        turn_runner.handle(turn_id)
        with engine.connect() as conn:
            queued = list(conn.execute(
                select(operations.c.operation_id).where(operations.c.state == State.QUEUED.value)
                .order_by(operations.c.position)
            ).scalars())
        for operation_id in queued:
            op_runner.handle(operation_id)
        reconciler.sweep()
        state = turn_state(engine, turn_id)
        if state != "running":
            return state
    return turn_state(engine, turn_id)
