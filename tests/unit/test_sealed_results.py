"""Sealed results, end to end in process: a tool's output or error carrying a canary
secret, in each shape it is written in, is stored sanitised by the worker, so no
reader a model is fed from — `results()`, `final()`, each provider surface's
`write_results`, `toolfence results` (plain and `--provider`) — shows the canary,
and each shows the redaction marker instead. A tool's render view is stored for
people and appears in none of them.

Runs the real `OperationRunner` and relay on the embedded default (SQLite file,
filesystem broker under TOOLFENCE_HOME), as tests/unit/test_cli.py does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from executor.cli.main import main
from executor.core.sanitize import REDACTED
from executor.core.tools import load_registry
from executor.core.types import ProposedCall
from executor.providers import SURFACES
from executor.settings import Settings
from executor.store import engine as store_engine
from executor.store import schema
from executor.worker.runner import OperationRunner
from outbox.relay import Relay
from outbox.results import final, results
from tests.fixtures.sealed_tools import CANARY, CANARY_FORMS, RENDER_ONLY

FORMS = sorted(CANARY_FORMS)
TOOLS = ("sealed.fetch", "sealed.note", "sealed.fail")


@pytest.fixture
def home(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in list(os.environ):
        if name.startswith("TOOLFENCE_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name)
    monkeypatch.setenv("TOOLFENCE_HOME", str(tmp_path))
    monkeypatch.setenv("TOOLFENCE_TOOLS", "tests.fixtures.sealed_tools:registry")
    monkeypatch.chdir(tmp_path)
    engines: dict[str, Any] = {}
    monkeypatch.setattr(store_engine, "_engines", engines)
    yield tmp_path
    for engine in engines.values():
        engine.dispose()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def execute_everything() -> None:
    settings = Settings.from_env()
    engine = store_engine.get_engine(settings.database_url)
    published: list[str] = []
    relay = Relay(settings, engine, published.append)
    runner = OperationRunner(settings, load_registry(settings.tools_module), engine)
    handled = 0
    while relay.run_once():
        for operation_id in published[handled:]:
            runner.handle(operation_id)
        handled = len(published)


@pytest.fixture
def request_with_every_form(home: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """One request: each tool called once with each canary form; all executed."""
    calls = [
        {"call_id": f"{tool}-{index}", "tool_name": tool, "arguments": json.dumps({"form": form})}
        for tool in TOOLS
        for index, form in enumerate(FORMS)
    ]
    (home / "calls.json").write_text(json.dumps(calls), encoding="utf-8")
    cli(capsys, "enqueue", "calls.json", "--tenant", "acme", "--principal", "alice",
        "--request-id", "req-sealed")
    execute_everything()
    return [call["call_id"] for call in calls]


def test_results__canary_in_every_form__absent_and_redacted_for_each_tool(
    request_with_every_form: list[str],
) -> None:
    engine = store_engine.get_engine(Settings.from_env().database_url)

    statuses = results(engine, "acme", "req-sealed")

    assert [s.call_id for s in statuses] == request_with_every_form
    for status in statuses:
        shown = json.dumps(final(status).model_dump(mode="json"), ensure_ascii=False)
        assert CANARY not in shown, (status.call_id, shown)
        assert REDACTED in shown, (status.call_id, shown)
        assert RENDER_ONLY not in shown, (status.call_id, shown)
        assert CANARY not in json.dumps(status.model_dump(mode="json"), ensure_ascii=False)


@pytest.mark.parametrize("surface_name", sorted(SURFACES))
def test_write_results__canary_in_every_form__absent_from_each_surface(
    request_with_every_form: list[str], surface_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = store_engine.get_engine(Settings.from_env().database_url)
    statuses = results(engine, "acme", "req-sealed")
    proposals = [
        ProposedCall(call_id=s.call_id, tool_name=s.tool_name, arguments="{}") for s in statuses
    ]

    written = json.dumps(
        SURFACES[surface_name].write_results(proposals, [final(s) for s in statuses]),
        ensure_ascii=False,
    )
    from_cli = cli(capsys, "results", "req-sealed", "--tenant", "acme", "--provider", surface_name)

    for shown in (written, from_cli):
        assert CANARY not in shown
        assert RENDER_ONLY not in shown
        # One marker at least per call: every call's text carried the canary.
        assert shown.count(REDACTED) >= len(statuses)


def test_toolfence_results__canary_in_every_form__absent_and_redacted(
    request_with_every_form: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    shown = cli(capsys, "results", "req-sealed", "--tenant", "acme")

    printed = json.loads(shown)
    assert [p["call_id"] for p in printed] == request_with_every_form
    assert CANARY not in shown and RENDER_ONLY not in shown
    assert all(REDACTED in json.dumps(p) for p in printed)


def test_stored_result__render_view__kept_for_people_beside_the_sealed_model_view(
    request_with_every_form: list[str],
) -> None:
    engine = store_engine.get_engine(Settings.from_env().database_url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(schema.operations.c.tool_name, schema.operations.c.result).where(
                schema.operations.c.tool_name == "sealed.fetch"
            )
        ).all()

    assert len(rows) == len(FORMS)
    for row in rows:
        stored = json.loads(row.result)
        assert RENDER_ONLY in stored["render_view"]["html"]
        assert CANARY not in json.dumps(stored["model_view"])
        assert stored["untrusted"] is True
