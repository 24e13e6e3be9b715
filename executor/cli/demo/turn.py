"""The demo's durable turn: one scripted multi-step turn with a worker killed in the middle.

After the workload's invariants are computed (so the table above stays about the
workload), the demo starts a turn for alice of acme whose scripted model reads a
balance, credits an account, then answers. The workers carry one fault point,
`turn_step_recorded:step2=sleep2`: the worker holding the turn pauses right after
it checkpointed step 2, before enqueueing its call, and the demo SIGKILLs that
process there. Nothing else knows about the dead holder: its lease expires, the
reconciler gives the turn back, another worker takes it over with a new
generation, enqueues step 2's call (the model is not asked again: the step is
recorded) and finishes. The demo then shows the turn's steps and checks that
every scripted step was asked once and every operation of the turn took effect
at most once. Step 1 also works out the credit's amount in the sandbox
(`sandbox.run_python`): one sandboxed calculation, checked for its answer.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from executor.cli.demo.choreography import DemoRun
from executor.cli.demo.constants import pause
from executor.core.types import ServerContext
from executor.store import turns as turn_store
from executor.store.schema import turn_steps
from executor.turns.drivers import scripted_calls
from executor.turns.service import get_turn, start_turn, turn_summary

REQUESTER = ServerContext(
    principal="alice@acme", tenant="acme", roles=frozenset({"member"}), request_id="demo-turn"
)
# The reserve's top-up is the sum of three invoices, worked out in the sandbox
# (sandbox.run_python) beside the balance read: one step, two reads.
CALCULATION = "invoices = [4_000, 3_500, 5_000]\nprint(sum(invoices))\n"
CALCULATED = "12500"
SCRIPT = [
    {"tool_calls": [{"id": "read-1", "name": "ledger.get_balance",
                     "arguments": {"account_id": "acme-payroll"}},
                    {"id": "calc-1", "name": "sandbox.run_python",
                     "arguments": {"code": CALCULATION, "timeout_seconds": 5}}]},
    {"tool_calls": [{"id": "credit-1", "name": "ledger.credit",
                     "arguments": {"account_id": "acme-reserve", "amount_cents": 12_500}}]},
    {"final": "Done: acme-reserve was credited 125.00 after checking acme-payroll."},
]
TURN_TIMEOUT_SECONDS = 60.0


@dataclass
class TurnOutcome:
    turn_id: str
    state: str
    summary: str
    seconds: float
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.state == "succeeded" and all(ok for _, ok, _ in self.checks)


def _holder_pid(run: DemoRun, turn_id: str) -> int | None:
    with run.reader.connect() as conn:
        row = turn_store.get_turn(conn, turn_id)
    if row is None or not row.owner_token:
        return None
    return int(row.owner_token.split("-", 1)[0])


def _steps(run: DemoRun, turn_id: str) -> dict[int, int]:
    """Step number → the generation that recorded it."""
    with run.reader.connect() as conn:
        return dict(conn.execute(
            select(turn_steps.c.step, turn_steps.c.generation).where(turn_steps.c.turn_id == turn_id)
        ).all())


def _calculation(view: dict[str, Any]) -> tuple[bool, str]:
    """Did the sandboxed calculation answer? On a machine that cannot build the sandbox
    the tool refuses (`sandbox_unavailable`) and never runs the program unsandboxed:
    that refusal is the right answer there, and the line says so."""
    calls = [c for s in view["steps"] for c in s["calls"] if c["call_id"] == "calc-1"]
    if not calls:
        return False, "the turn proposed no calculation"
    call = calls[0]
    if call["status"] == "succeeded":
        output = call.get("output") or {}
        answered = output.get("outcome") == "ok" and output.get("stdout", "").strip() == CALCULATED
        return answered, f"sandbox.run_python printed {output.get('stdout', '').strip()[:40]!r}"
    code = call.get("error", {}).get("code", call["status"])
    if code == "sandbox_unavailable":
        return True, "refused here: this machine cannot build the sandbox (toolfence sandbox check)"
    return False, f"sandbox.run_python ended {code}"


def run_turn(run: DemoRun) -> TurnOutcome:
    """Start the turn, kill its holder after step 2's checkpoint, wait for its end, check it."""
    from ledger.service import effects

    script = run.place.run_dir / "turn.jsonl"
    script.write_text("".join(json.dumps(line) + "\n" for line in SCRIPT), encoding="utf-8")
    with run.engine.begin() as conn:
        turn_id = start_turn(
            conn, REQUESTER, "demo-conversation", "Check payroll, then credit the reserve with 125.00.",
            driver=f"scripted:{Path(script).resolve()}",
        ).turn_id
    run.say(
        f"turn {turn_id}: started for {REQUESTER.principal} "
        "(scripted model: read and calculate, write, answer)"
    )
    started = time.monotonic()
    deadline = started + TURN_TIMEOUT_SECONDS
    killed: int | None = None
    while time.monotonic() < deadline:
        run.tick()
        if killed is None and 2 in _steps(run, turn_id):
            pid = _holder_pid(run, turn_id)
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed = pid
                    run.accounted_for.add(pid)
                    run.fault(f"SIGKILL worker process {pid} holding the turn, after step 2's checkpoint")
                except ProcessLookupError:
                    pass
        view = get_turn(run.engine, REQUESTER.tenant, turn_id)
        if view is not None and view["state"] not in ("running", "waiting_approval"):
            break
        pause(0.05)
    view = get_turn(run.engine, REQUESTER.tenant, turn_id)
    assert view is not None
    asked: dict[int, int] = {}
    for entry in scripted_calls(script):
        asked[entry["call_index"]] = asked.get(entry["call_index"], 0) + 1
    operation_ids = [c["operation_id"] for s in view["steps"] for c in s["calls"] if c.get("operation_id")]
    with run.reader.connect() as conn:
        effect_rows = conn.execute(
            select(effects.c.operation_id).where(effects.c.operation_id.in_(operation_ids))
        ).scalars().all()
    per_operation = {op: effect_rows.count(op) for op in operation_ids}
    generations = _steps(run, turn_id)
    calculation = _calculation(view)
    outcome = TurnOutcome(turn_id, view["state"], turn_summary(view), time.monotonic() - started)
    outcome.checks = [
        ("a worker was killed mid-turn", killed is not None,
         f"pid {killed}" if killed is not None else "the turn ended before the demo could kill its holder"),
        ("each model step asked once", bool(asked) and set(asked.values()) == {1},
         ", ".join(f"step {k}: {v}×" for k, v in sorted(asked.items()))),
        ("≤ 1 side effect per operation of the turn", all(n <= 1 for n in per_operation.values()),
         f"{sum(per_operation.values())} effect(s) over {len(per_operation)} operation(s)"),
        ("resumed by a new generation", len(set(generations.values())) > 1,
         ", ".join(f"step {k}: generation {g}" for k, g in sorted(generations.items()))),
        ("one calculation ran sandboxed", *calculation),
    ]
    return outcome
