"""An eval run: each case's messages as durable turns, at most N cases at once,
resumable after a crash without running a finished case again.

A run is a directory: `manifest.json` (the fixtures' hash, the driver, a run token
and, per case, the turn ids it started and whether it is done), the scripts the
recorded and perturbing drivers wrote, and, on the embedded default, the run's
own SQLite database, filesystem broker and fleet logs. A turn's id is derived
from the run token, the case and the message (`ev<token>-<case>-t<n>`), so a run
killed between writing a turn and writing the manifest finds the turn in the
database when it resumes and does not start it again; a finished case is read
back from its turns, never re-run. The run is itself a set of turn jobs: the
fleet keeps running a turn while the eval process is away.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from executor.core.states import TURN_ENDED, TurnState
from executor.core.tools import Registry
from executor.core.types import ServerContext
from executor.eval.declared import surface_name
from executor.eval.downstream import Downstream
from executor.eval.drivers import CasePlan
from executor.eval.fixtures import Case, FixtureError, Fixtures
from executor.store import turns as turn_store
from executor.turns.contract import proposals_from_json
from executor.turns.service import get_turn, start_turn
from executor.turns.values import TurnOptions

MANIFEST = "manifest.json"
SETTLED = frozenset({*(s.value for s in TURN_ENDED), TurnState.WAITING_APPROVAL.value})
"""A turn the eval stops waiting for: ended, or waiting for a person (no approver
takes part in an eval: the case's expectations say what must hold meanwhile)."""
POLL_SECONDS = 0.2


class RunDirError(FixtureError):
    """The run directory holds another run (other fixtures or driver), or is unreadable."""


@dataclass
class Manifest:
    path: Path
    token: str
    fixtures: str
    sha256: str
    driver: str
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def open(cls, run_dir: Path, fixtures: Fixtures, driver: str) -> Manifest:
        """The run directory's manifest, created for a new run; a resumed run must name
        the same fixtures (by content) and driver."""
        path = run_dir / MANIFEST
        if not path.exists():
            run_dir.mkdir(parents=True, exist_ok=True)
            manifest = cls(path, secrets.token_hex(4), str(fixtures.path), fixtures.sha256, driver)
            manifest.save()
            return manifest
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            manifest = cls(
                path, data["token"], data["fixtures"], data["sha256"], data["driver"], data["cases"]
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RunDirError(f"{path}: not a readable eval manifest ({exc})") from None
        if manifest.sha256 != fixtures.sha256:
            raise RunDirError(
                f"{run_dir} holds a run of other fixtures ({manifest.fixtures}): use another --run-dir"
            )
        if manifest.driver != driver:
            raise RunDirError(
                f"{run_dir} holds a run with --driver {manifest.driver!r}: use another --run-dir"
            )
        return manifest

    def save(self) -> None:
        data = {"token": self.token, "fixtures": self.fixtures, "sha256": self.sha256,
                "driver": self.driver, "cases": self.cases}
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(temporary, self.path)

    def entry(self, case_id: str) -> dict[str, Any]:
        return self.cases.setdefault(case_id, {"turns": [], "done": False})

    def done(self, case_id: str) -> bool:
        return bool(self.cases.get(case_id, {}).get("done"))


def check_cases(cases: Sequence[Case], registry: Registry) -> None:
    """What the registry must declare for the cases to run: each named tool and surface
    (a mistake in the fixtures is refused before any turn starts, not midway)."""
    names = set(registry.names())
    for case in cases:
        missing = sorted(t for t in case.tools if isinstance(t, str) and t not in names)
        if missing:
            raise FixtureError(f"case {case.id!r}: the registry declares no tool {', '.join(missing)}")
        if case.surface and registry.surface(case.surface) is None:
            raise FixtureError(f"case {case.id!r}: the registry declares no surface {case.surface!r}")


def turn_id_of(token: str, index: int, turn: int) -> str:
    return f"ev{token}-{index:04d}-t{turn}"


def conversation_of(token: str, index: int) -> str:
    return f"eval-{token}-{index:04d}"


def context_of(case: Case) -> ServerContext:
    return ServerContext(
        principal=case.principal, tenant=case.tenant, roles=frozenset(case.roles), request_id="eval"
    )


def compose_message(case: Case, turn: int, earlier_answers: Sequence[str | None]) -> str:
    """The turn's message: the case's prior turns and this case's earlier turns (with
    the answers they got) as a transcript, then the message itself. A driver sees one
    message per turn, so the conversation so far travels in it."""
    lines = [f"{prior.role}: {prior.content}" for prior in case.prior]
    for number in range(turn - 1):
        lines.append(f"user: {case.messages[number]}")
        lines.append(f"assistant: {earlier_answers[number] or ''}")
    message = case.messages[turn - 1]
    if not lines:
        return message
    return "Earlier in this conversation:\n" + "\n".join(lines) + f"\n\nNow: {message}"


@dataclass
class Runner:
    plans: Sequence[CasePlan]
    manifest: Manifest
    engine: Engine
    registry: Registry | None
    parallel: int = 4
    case_timeout: float = 300.0
    max_steps: int = 8
    on_progress: Callable[[str], None] = lambda line: None

    def _surface(self, case: Case) -> str | None:
        if case.surface:
            return case.surface
        return surface_name(case) if case.declared else None

    def _start(self, index: int, plan: CasePlan, turn: int, answers: Sequence[str | None]) -> None:
        case = plan.case
        turn_id = turn_id_of(self.manifest.token, index, turn)
        with self.engine.begin() as conn:
            start_turn(
                conn, context_of(case), conversation_of(self.manifest.token, index),
                compose_message(case, turn, answers), driver=plan.drivers[turn - 1],
                options=TurnOptions(max_steps=self.max_steps), scope="conversation", when_busy="refuse",
                turn_id=turn_id, surface=self._surface(case), registry=self.registry,
            )

    def advance(self, index: int, plan: CasePlan) -> bool:
        """Start the case's next turn when the one before it settled; True once all did."""
        entry = self.manifest.entry(plan.case.id)
        answers: list[str | None] = []
        for turn in range(1, len(plan.case.messages) + 1):
            turn_id = turn_id_of(self.manifest.token, index, turn)
            with self.engine.connect() as conn:
                row = turn_store.get_turn(conn, turn_id)
            if row is None:
                self._start(index, plan, turn, answers)
            if turn_id not in entry["turns"]:
                entry["turns"].append(turn_id)
                self.manifest.save()
            if row is None or row.state not in SETTLED:
                return False
            answers.append(row.final_output)
        entry["done"] = True
        self.manifest.save()
        return True

    def run(self) -> None:
        waiting = [(i, p) for i, p in enumerate(self.plans) if not self.manifest.done(p.case.id)]
        finished = len(self.plans) - len(waiting)
        if finished:
            self.on_progress(f"resuming: {finished} of {len(self.plans)} case(s) already finished")
        active: dict[int, float] = {}
        while waiting or active:
            while waiting and len(active) < self.parallel:
                index, plan = waiting.pop(0)
                active[index] = time.monotonic() + self.case_timeout
            for index in list(active):
                plan = self.plans[index]
                if self.advance(index, plan):
                    del active[index]
                    finished += 1
                    self.on_progress(f"[{finished}/{len(self.plans)}] {plan.case.id}")
                elif time.monotonic() > active[index]:
                    del active[index]
                    entry = self.manifest.entry(plan.case.id)
                    entry.update(done=True, timed_out=True)
                    self.manifest.save()
                    finished += 1
                    self.on_progress(f"[{finished}/{len(self.plans)}] {plan.case.id}: timed out")
            if active:
                time.sleep(POLL_SECONDS)


def _proposals(conn: Any, turn: int, turn_id: str) -> list[dict[str, Any]]:
    found = []
    for row in turn_store.steps_of(conn, turn_id):
        for proposal in proposals_from_json(json.loads(row.proposals)):
            arguments: Any = proposal.arguments
            if isinstance(arguments, bytes | str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    arguments = None
            found.append({"turn": turn, "step": row.step, "call_id": proposal.call_id,
                          "tool": proposal.tool_name,
                          "arguments": arguments if isinstance(arguments, dict) else None})
    return found


def _add_usage(total: dict[str, Any], step: Mapping[str, Any]) -> None:
    """A checkpointed step's usage (its model call), summed: what the case cost."""
    total["model_calls"] += 1
    total["input_tokens"] += int(step.get("input_tokens") or 0)
    total["output_tokens"] += int(step.get("output_tokens") or 0)
    if step.get("cost_usd") is None:
        total["cost_known"] = False
    else:
        total["cost_usd"] += float(step["cost_usd"])


def observe(
    plans: Sequence[CasePlan], manifest: Manifest, engine: Engine, database_url: str, downstream: Downstream
) -> list[dict[str, Any]]:
    """What happened to each case, read back from the turns and the downstream's records."""
    observations = []
    for index, plan in enumerate(plans):
        case = plan.case
        turns: list[dict[str, Any]] = []
        operation_ids: list[str] = []
        usage = {"model_calls": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0,
                 "cost_known": True}
        for turn in range(1, len(case.messages) + 1):
            turn_id = turn_id_of(manifest.token, index, turn)
            view = get_turn(engine, case.tenant, turn_id)
            if view is None:
                turns.append({"turn_id": turn_id, "state": "not_started", "proposals": [], "calls": {}})
                continue
            with engine.connect() as conn:
                proposals = _proposals(conn, turn, turn_id)
            calls: dict[str, Any] = {}
            for step in view["steps"]:
                _add_usage(usage, step["usage"])
                for status in step["calls"]:
                    calls[status["call_id"]] = status
                    if status.get("operation_id"):
                        operation_ids.append(status["operation_id"])
            turns.append({
                "turn_id": turn_id, "state": view["state"], "end_reason": view["end_reason"],
                "final_output": view["final_output"], "error": view["error"],
                "proposals": proposals, "calls": calls,
            })
        observations.append({
            "case": case.id, "category": case.category, "perturbation": plan.perturbation,
            "turns": turns, "effects": downstream.effects(database_url, sorted(set(operation_ids))),
            "usage": usage,
            "timed_out": bool(manifest.cases.get(case.id, {}).get("timed_out"))
            and any(t["state"] not in SETTLED for t in turns),
        })
    return observations
