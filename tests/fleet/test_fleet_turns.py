"""Durable turns on a real fleet: PostgreSQL, Redis, relay, workers and reconciler as
subprocesses, the scripted driver, and SIGKILLs in the middle of a turn.

Faults come from a points file the workers re-read when it changes
(`TOOLFENCE_FAULT_POINTS_FILE`), and each firing is logged before it acts
(`TOOLFENCE_FAULT_LOG`), so a test kills a worker process at one exact point,
then switches that fault off before the fleet comes back to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetkit import metric, on_both_brokers, wait_until
from sqlalchemy import select

from executor.cli.fleet import Fleet
from executor.core.types import ServerContext
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.store.schema import turn_steps
from executor.turns.drivers import scripted_calls
from executor.turns.service import get_turn, start_turn
from ledger.service import Ledger

MakeFleet = Callable[..., Fleet]
ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="turn")

SCRIPT = [
    {"tool_calls": [{"id": "c1", "name": "ledger.get_balance", "arguments": {"account_id": "acme-1"}}]},
    {"tool_calls": [{"id": "c2", "name": "ledger.credit",
                     "arguments": {"account_id": "acme-2", "amount_cents": 500}}]},
    {"final": "acme-2 has been credited 5.00."},
]


def write_script(path: Path) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in SCRIPT), encoding="utf-8")
    return path


def asked(script: Path) -> dict[int, int]:
    counts: dict[int, int] = {}
    for entry in scripted_calls(script):
        counts[entry["call_index"]] = counts.get(entry["call_index"], 0) + 1
    return counts


def turn_view(settings: Settings, turn_id: str) -> dict[str, Any]:
    engine = make_engine(settings.database_url)
    try:
        view = get_turn(engine, "acme", turn_id)
    finally:
        engine.dispose()
    assert view is not None
    return view


def begin_turn(settings: Settings, script: Path) -> str:
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            handle = start_turn(conn, ALICE, "conv-1", "Credit acme-2 with 5.00", driver=f"scripted:{script}")
        return handle.turn_id
    finally:
        engine.dispose()


def test_fleet_turn__read_write_final__succeeds_with_one_effect(
    settings: Settings, ledger: Ledger, make_fleet: MakeFleet, tmp_path: Path
) -> None:
    # Given a fleet (relay, one worker with two pool children, reconciler)
    make_fleet(workers=1, concurrency=2, relays=1, reconcile_every=0.3).start()
    script = write_script(tmp_path / "turn.jsonl")
    # When a turn is started
    turn_id = begin_turn(settings, script)
    # Then a worker runs it to the end: succeeded, with the model's final text
    view = wait_until(lambda: (v := turn_view(settings, turn_id))["state"] != "running" and v,
                      timeout=60, what="the turn to end", show=lambda: turn_view(settings, turn_id))
    assert (view["state"], view["final_output"]) == ("succeeded", "acme-2 has been credited 5.00.")
    [credit] = view["steps"][1]["calls"]
    assert ledger.effects_per_operation() == {credit["operation_id"]: 1}
    assert asked(script) == {1: 1, 2: 1, 3: 1}


@on_both_brokers
def test_fleet_turn__sigkill_during_the_write_and_between_steps__finishes_each_effect_once(
    fleet_env: dict[str, str], settings: Settings, ledger: Ledger, make_fleet: MakeFleet, tmp_path: Path
) -> None:
    points, log = tmp_path / "faults.spec", tmp_path / "faults.log"
    # Given a worker process that dies (SIGKILL) right after step 2's write took effect
    points.write_text("after_effect:ledger.credit=kill")
    fleet = make_fleet(
        workers=1, concurrency=2, relays=1, reconcile_every=0.3,
        env={"TOOLFENCE_FAULT_POINTS_FILE": str(points), "TOOLFENCE_FAULT_LOG": str(log)},
    ).start()
    script = write_script(tmp_path / "turn.jsonl")
    turn_id = begin_turn(settings, script)

    def fired(entry: str) -> bool:
        return log.exists() and entry in log.read_text()

    wait_until(lambda: fired("after_effect ledger.credit kill"), timeout=60,
               what="the worker to die inside step 2's write", show=fleet.logs)
    # And then, once the write is retried, the process running the turn dies between
    # steps 2 and 3 (before the model is asked for step 3)
    points.write_text("turn_before_model:step3=kill")
    wait_until(lambda: fired("turn_before_model step3 kill"), timeout=60,
               what="the turn's worker to die before step 3", show=fleet.logs)
    points.write_text("")
    # When the fleet goes on (Celery replaces the dead pool children; the lease expires)
    view = wait_until(lambda: (v := turn_view(settings, turn_id))["state"] != "running" and v,
                      timeout=90, what="the turn to end", show=fleet.logs)
    # Then the turn finished with the model's final answer
    assert (view["state"], view["final_output"]) == ("succeeded", "acme-2 has been credited 5.00.")
    # And every operation's effect happened exactly once (the credit ran twice, deduped)
    [credit] = view["steps"][1]["calls"]
    assert credit["status"] == "succeeded"
    effects = ledger.effects_per_operation()
    assert effects == {credit["operation_id"]: 1}
    assert ledger.balance("acme-2") == 500
    # And no step was asked twice: each scripted line was read once
    assert asked(script) == {1: 1, 2: 1, 3: 1}
    # And step 3 was recorded by a later generation than step 2: the turn was taken over
    engine = make_engine(settings.database_url)
    with engine.connect() as conn:
        generations = dict(conn.execute(
            select(turn_steps.c.step, turn_steps.c.generation).where(turn_steps.c.turn_id == turn_id)
        ).all())
    engine.dispose()
    assert generations[3] > generations[2]
    assert metric(fleet_env["PROMETHEUS_MULTIPROC_DIR"], "toolfence_turn_resumes_total") >= 1
