"""What an operator sees of a failed MCP call: `toolfence show` prints its stable cause.

The whole path in one process: `toolfence enqueue`, the relay and a worker's
runner, a real fixture MCP server, then `toolfence show` on the embedded
default (a SQLite file under TOOLFENCE_HOME).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executor.cli.main import main
from executor.core.tools import load_registry
from executor.mcp import shutdown_connections
from executor.settings import Settings
from executor.store import engine as store_engine
from executor.worker.runner import OperationRunner
from outbox.relay import Relay

pytestmark = pytest.mark.timeout(120)

WHO = ["--tenant", "acme", "--principal", "alice", "--roles", "member"]


@pytest.fixture
def home(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The embedded default under tmp_path, with the fixture server's tools registered."""
    for name in list(os.environ):
        if name.startswith("TOOLFENCE_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name)
    monkeypatch.setenv("TOOLFENCE_HOME", str(tmp_path))
    monkeypatch.setenv("TOOLFENCE_TOOLS", "tests.fixtures.mcp_cli_tools:build")
    monkeypatch.chdir(tmp_path)
    engines: dict[str, Any] = {}
    monkeypatch.setattr(store_engine, "_engines", engines)
    yield tmp_path
    shutdown_connections()
    for engine in engines.values():
        engine.dispose()


def toolfence(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def enqueue_and_run(capsys: pytest.CaptureFixture[str], home: Path, call: dict[str, Any]) -> str:
    calls = home / "calls.json"
    calls.write_text(json.dumps([{**call, "arguments": json.dumps(call["arguments"])}]))
    handle = toolfence(capsys, "enqueue", str(calls), *WHO, "--request-id", "req-op")
    settings = Settings.from_env()
    engine = store_engine.get_engine(settings.database_url)
    published: list[str] = []
    runner = OperationRunner(settings, load_registry(settings.tools_module), engine)
    Relay(settings, engine, published.append).run_once()
    for operation_id in published:
        runner.handle(operation_id)
    return str(handle["calls"][0]["operation_id"])


def test_show__mcp_tool_error__cause_and_the_servers_code_shown(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    operation_id = enqueue_and_run(capsys, home, {
        "call_id": "c1", "tool_name": "fx.fail_structured",
        "arguments": {"message": "no such order; token=tok_9f8e7d6c5b", "code": "not_found"},
    })

    shown = toolfence(capsys, "show", operation_id, "--tenant", "acme")

    assert (shown["state"], shown["error_code"], shown["cause"]) == (
        "failed_terminal", "execution_failed", "mcp_tool_error",
    )
    details = {(d["path"], d["code"]) for d in shown["error"]["details"]}
    assert ("structuredContent.error.code", "not_found") in details
    assert "tok_9f8e7d6c5b" not in json.dumps(shown)


def test_show__mcp_read_timed_out__waiting_to_retry_with_cause_timeout(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    operation_id = enqueue_and_run(capsys, home, {
        "call_id": "c1", "tool_name": "fx.slow", "arguments": {"seconds": 30},
    })

    shown = toolfence(capsys, "show", operation_id, "--tenant", "acme")

    assert (shown["state"], shown["error_code"], shown["cause"]) == ("retry_wait", "timeout", "mcp_timeout")
