"""`toolfence turn start` and `toolfence turn show` on the embedded default (SQLite).

The relay publishes the turn's outbox row (kind `turn`) and the operations'
rows; the turn job and the operations run in this process, as a worker's pool
would run them, until the turn ends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from executor.cli.main import main
from executor.core.tools import load_registry
from executor.settings import Settings
from executor.store import engine as store_engine
from executor.worker.runner import OperationRunner
from executor.worker.turns import TurnRunner
from ledger import service as ledger_service
from ledger.service import Ledger
from outbox.relay import Relay

WHO = ["--tenant", "acme", "--principal", "alice", "--conversation", "conv-1"]


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def home(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in list(os.environ):
        if name.startswith("TOOLFENCE_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name)
    monkeypatch.setenv("TOOLFENCE_HOME", str(tmp_path))
    monkeypatch.setenv("TOOLFENCE_TOOLS", "ledger.tools:registry")  # no default: the example's
    monkeypatch.setenv("TOOLFENCE_TURN_WAIT_SECONDS", "0.05")
    monkeypatch.chdir(tmp_path)
    engines: dict[str, Any] = {}
    monkeypatch.setattr(store_engine, "_engines", engines)
    book = Ledger(sqlite_url)
    book.create_schema()
    book.open_account("acc-1", "acme", 100_000)
    book.open_account("acc-2", "acme", 0)
    monkeypatch.setattr(ledger_service, "_default", book)
    yield tmp_path
    for engine in engines.values():
        engine.dispose()
    book.engine.dispose()


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    def run(*argv: str) -> Run:
        code = main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


def run_fleet_in_process(turn_id: str) -> None:
    """Relay passes, each published turn job and operation handled, until nothing is left."""
    settings = Settings.from_env()
    engine = store_engine.get_engine(settings.database_url)
    registry = load_registry(settings.tools_module)
    ops: list[str] = []
    turn_jobs: list[str] = []
    relay = Relay(settings, engine, ops.append, turn_jobs.append)
    op_runner = OperationRunner(settings, registry, engine)
    turn_runner = TurnRunner(settings, registry, engine)
    for _ in range(50):
        relay.run_once()
        while turn_jobs or ops:
            if turn_jobs:
                turn_runner.handle(turn_jobs.pop(0))
            while ops:
                op_runner.handle(ops.pop(0))
        with engine.connect() as conn:
            from executor.store import turns as turn_store

            row = turn_store.get_turn(conn, turn_id)
        if row is not None and row.state not in ("running",):
            return
        import time

        time.sleep(0.6)  # a released turn job is due again after half a second


def credit_script(path: Path) -> Path:
    """A scripted model that credits acc-2 with 2.50, then answers."""
    path.write_text("\n".join(json.dumps(line) for line in [
        {"tool_calls": [{"id": "c1", "name": "ledger.credit",
                         "arguments": {"account_id": "acc-2", "amount_cents": 250}}]},
        {"final": "Credited 2.50."},
    ]) + "\n")
    return path


def test_turn_start__then_show__runs_the_scripted_turn_to_its_final_output(
    home: Path, cli: Callable[..., Run]
) -> None:
    credit_script(home / "turn.jsonl")
    # When a turn is started from the CLI (the script's path relative to the cwd)
    started = cli("turn", "start", *WHO, "--driver", "scripted:turn.jsonl", "Credit acc-2 with 2.50")
    assert started.code == 0, started.err
    turn_id = started.out.strip()
    assert turn_id.startswith("turn_") and "\n" not in turn_id
    # Then a second one for the same user is refused while it runs
    again = cli("turn", "start", *WHO, "--driver", "scripted:turn.jsonl", "again")
    assert again.code == 1 and "turn_in_progress" in again.err and again.out == ""
    # When the fleet runs it
    run_fleet_in_process(turn_id)
    # Then `turn show --json` has the steps, the call's result and the final output
    shown = cli("turn", "show", turn_id, "--tenant", "acme", "--json")
    assert shown.code == 0, shown.err
    view = json.loads(shown.out)
    assert (view["state"], view["final_output"]) == ("succeeded", "Credited 2.50.")
    assert [c["status"] for c in view["steps"][0]["calls"]] == ["succeeded"]
    # And the plain form says the same to a person
    text = cli("turn", "show", turn_id, "--tenant", "acme").out
    assert f"turn {turn_id}  state succeeded  (final)" in text
    assert "c1 ledger.credit succeeded" in text and "final output: Credited 2.50." in text


def test_turn_show__unknown_or_other_tenant__one_line_error(home: Path, cli: Callable[..., Run]) -> None:
    script = home / "turn.jsonl"
    script.write_text('{"final": "hi"}\n')
    turn_id = cli("turn", "start", *WHO, "--driver", f"scripted:{script}", "hi").out.strip()
    unknown = ["turn", "show", "turn_nope", "--tenant", "acme"]
    for argv in (unknown, ["turn", "show", turn_id, "--tenant", "globex"]):
        run = cli(*argv)
        assert run.code == 1 and run.out == "" and len(run.err.splitlines()) == 1 and "no turn" in run.err


def test_turn_start__no_driver_or_a_bad_one__one_line_error(home: Path, cli: Callable[..., Run]) -> None:
    for extra, fragment in (([], "--driver"), (["--driver", "llama:7b"], "unknown driver kind")):
        run = cli("turn", "start", *WHO, *extra, "hi")
        assert run.code == 1 and fragment in run.err and "Traceback" not in run.err


def test_relay__turn_rows__published_as_turn_jobs_only_by_a_relay_that_can(
    home: Path, cli: Callable[..., Run]
) -> None:
    # Given a started turn: its outbox row is of kind `turn`
    script = home / "turn.jsonl"
    script.write_text('{"final": "hi"}\n')
    turn_id = cli("turn", "start", *WHO, "--driver", f"scripted:{script}", "hi").out.strip()
    settings = Settings.from_env()
    engine = store_engine.get_engine(settings.database_url)
    # When a relay without a turn publisher passes, it publishes nothing and leaves the row
    ops: list[str] = []
    assert Relay(settings, engine, ops.append).run_once() == 0
    # Then a relay with one publishes the turn id to it, never to the operations' task
    turn_jobs: list[str] = []
    assert Relay(settings, engine, ops.append, turn_jobs.append).run_once() == 1
    assert (ops, turn_jobs) == ([], [turn_id])


def test_turn_start__surface__the_turn_runs_under_it_and_show_prints_it(
    home: Path, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given tools declaring the chat surface (writes become cards) and a script that credits
    monkeypatch.setenv("TOOLFENCE_TOOLS", "tests.surfacekit:registry")
    script = credit_script(home / "turn.jsonl")
    # When a turn is started with --surface chat and the fleet runs it
    started = cli("turn", "start", *WHO, "--driver", f"scripted:{script}", "--surface", "chat", "credit")
    assert started.code == 0, started.err
    turn_id = started.out.strip()
    run_fleet_in_process(turn_id)
    # Then the turn ran under chat: the credit (no approval of its own) waits as a card,
    # nothing was credited, and the turn ended on the card
    view = json.loads(cli("turn", "show", turn_id, "--tenant", "acme", "--json").out)
    assert view["surface"] == "chat"
    assert [c.get("state") for c in view["steps"][0]["calls"]] == ["pending_approval"]
    assert ledger_service.default_ledger().balance("acc-2") == 0
    # And the plain form names the surface under its head line
    text = cli("turn", "show", turn_id, "--tenant", "acme").out.splitlines()
    assert text[0].startswith(f"turn {turn_id}  state ") and text[1] == "  surface chat"


def test_turn_start__surface_from_the_setting__and_without_one_none(
    home: Path, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given tools declaring surfaces and TOOLFENCE_TURN_SURFACE=lookup
    monkeypatch.setenv("TOOLFENCE_TOOLS", "tests.surfacekit:registry")
    script = home / "turn.jsonl"
    script.write_text('{"final": "hi"}\n')
    driver = ["--driver", f"scripted:{script}"]
    monkeypatch.setenv("TOOLFENCE_TURN_SURFACE", "lookup")
    # When a turn is started without --surface, then one naming chat (another user)
    by_setting = cli("turn", "start", *WHO, *driver, "hi").out.strip()
    by_flag = cli("turn", "start", "--tenant", "acme", "--principal", "bob", "--conversation", "c-2",
                  *driver, "--surface", "chat", "hi").out.strip()
    # Then the first runs under the setting's surface, the second under the flag's
    surfaces = [json.loads(cli("turn", "show", t, "--tenant", "acme", "--json").out)["surface"]
                for t in (by_setting, by_flag)]
    assert surfaces == ["lookup", "chat"]
    # And without the setting or the flag, a turn has none, and show prints no surface line
    monkeypatch.delenv("TOOLFENCE_TURN_SURFACE")
    plain = cli("turn", "start", "--tenant", "acme", "--principal", "carol", "--conversation", "c-3",
                *driver, "hi").out.strip()
    assert json.loads(cli("turn", "show", plain, "--tenant", "acme", "--json").out)["surface"] is None
    assert "surface" not in cli("turn", "show", plain, "--tenant", "acme").out


def test_turn_start__surface_the_tools_do_not_declare__one_line_and_no_turn_written(
    home: Path, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy import func, select

    from executor.store.schema import outbox, turns

    script = home / "turn.jsonl"
    script.write_text('{"final": "hi"}\n')
    for tools in ("tests.surfacekit:registry", "ledger.tools:registry"):
        monkeypatch.setenv("TOOLFENCE_TOOLS", tools)
        # When a turn names a surface the tools do not declare (with a terminal escape in it)
        run = cli("turn", "start", *WHO, "--driver", f"scripted:{script}", "--surface", "gone\x1b[2J", "hi")
        # Then one line naming the declared ones, never the given name, and a non-zero exit
        assert run.code != 0 and run.out == "" and len(run.err.splitlines()) == 1
        assert "no such surface" in run.err and "gone" not in run.err
    # And nothing was written: no turn, no outbox row
    engine = store_engine.get_engine(Settings.from_env().database_url)
    with engine.connect() as conn:
        counts = [conn.execute(select(func.count()).select_from(t)).scalar_one() for t in (turns, outbox)]
    assert counts == [0, 0]
