"""`toolfence keys create --surface` and `toolfence serve` as real processes on
PostgreSQL: a key made for the `chat` surface of tests/surfacekit.py, its turns and
requests under that surface, and the same key refused 503 by a server whose tools
do not declare it (decision 0208)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from servekit import free_port, serve_subprocess
from sqlalchemy import Table, func, select

from executor.store.engine import make_engine
from executor.store.schema import api_keys, operations, turns
from ledger.service import Ledger

pytestmark = pytest.mark.slow

SURFACED = "tests.surfacekit:registry"
BARE = "tests.surfacekit:bare_registry"
CREATE = ["keys", "create", "--tenant", "acme", "--principal", "alice", "--role", "member",
          "--scope", "produce,approve,read"]


def toolfence(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "executor.cli.main", *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
    )


@pytest.fixture
def env(pg_url: str, book: Ledger, tmp_path: Path) -> dict[str, str]:
    script = tmp_path / "turn.jsonl"
    script.write_text(json.dumps({"final": "done"}) + "\n", encoding="utf-8")
    return {
        "TOOLFENCE_DATABASE_URL": pg_url,
        "TOOLFENCE_BROKER_URL": f"filesystem://{tmp_path / 'broker'}",
        "TOOLFENCE_TOOLS": SURFACED,
        "TOOLFENCE_HOME": str(tmp_path / "home"),
        "TOOLFENCE_TURN_DRIVER": f"scripted:{script}",
    }


@pytest.fixture
def serve(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Starts `toolfence serve` with `env` and the given changes; stopped at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(**changes: str) -> str:
        port = free_port()
        started.append(serve_subprocess({**env, **changes}, port, tmp_path / f"serve-{port}.log"))
        return f"http://127.0.0.1:{port}"

    yield start
    for process in started:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def count(pg_url: str, table: Table) -> int:
    engine = make_engine(pg_url)
    with engine.connect() as conn:
        found = int(conn.execute(select(func.count()).select_from(table)).scalar_one())
    engine.dispose()
    return found


def test_keys_create__surface_the_tools_do_not_declare__one_line_and_nothing_written(
    env: dict[str, str], pg_url: str
) -> None:
    # When a key is created for a surface TOOLFENCE_TOOLS does not declare
    refused = toolfence(env, *CREATE, "--surface", "chta\x1b[2J")
    # Then one line (naming the declared ones, never the given name), exit 2, no key
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1 and "no such surface" in refused.stderr
    assert "'chat'" in refused.stderr and "chta" not in refused.stderr
    assert count(pg_url, api_keys) == 0
    # And with tools that declare no surface at all, the same
    plain = toolfence({**env, "TOOLFENCE_TOOLS": BARE}, *CREATE, "--surface", "chat")
    assert plain.returncode == 2 and "(declared: none)" in plain.stderr
    assert count(pg_url, api_keys) == 0


def test_chat_key__serve_runs_its_turns_and_requests_under_chat__another_deployment_answers_503(
    env: dict[str, str], pg_url: str, serve: Callable[..., str]
) -> None:
    # Given a key created by the CLI for the chat surface, and `keys list` showing it
    created = toolfence(env, *CREATE, "--surface", "chat")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    [listed] = json.loads(toolfence(env, "keys", "list", "--tenant", "acme").stdout)
    assert listed["surface"] == "chat"
    headers = {"Authorization": f"Bearer {key}"}
    base = serve()
    # When it posts a turn and a credit (a write that needs no approval of its own)
    turn = httpx.post(f"{base}/v1/turns", headers=headers,
                      json={"conversation_id": "c-1", "message": "credit acme-2"})
    posted = httpx.post(f"{base}/v1/requests", headers=headers, json={"calls": [
        {"call_id": "c1", "tool_name": "ledger.credit",
         "arguments": {"account_id": "acme-2", "amount_cents": 5}},
        {"call_id": "c2", "tool_name": "ledger.create_invoice",
         "arguments": {"account_id": "acme-1", "amount_cents": 5}},
    ]})
    # Then the turn runs under chat, the credit is a card and the invoice is not offered
    assert turn.status_code == 202, turn.text
    view = httpx.get(f"{base}/v1/turns/{turn.json()['turn_id']}", headers=headers).json()
    assert view["surface"] == "chat"
    credit, outside = posted.json()["calls"]
    assert credit["state"] == "pending_approval"
    assert outside["error"]["code"] == "tool_not_allowed"
    # When a server whose tools do not declare chat receives the same key's work
    other = serve(TOOLFENCE_TOOLS=BARE)
    before = (count(pg_url, operations), count(pg_url, turns))
    refused = [
        httpx.post(f"{other}/v1/requests", headers=headers, json={"calls": [
            {"call_id": "c1", "tool_name": "ledger.get_balance", "arguments": {"account_id": "acme-1"}}]}),
        httpx.post(f"{other}/v1/turns", headers=headers, json={"conversation_id": "c-2", "message": "hi"}),
    ]
    # Then both are 503 turns_not_configured, and nothing was written
    assert [(r.status_code, r.json()["code"]) for r in refused] == [(503, "turns_not_configured")] * 2
    assert (count(pg_url, operations), count(pg_url, turns)) == before


def test_serve__a_default_surface_the_tools_do_not_declare__refused_at_start(env: dict[str, str]) -> None:
    # When serve starts with TOOLFENCE_TURN_SURFACE naming a surface its tools lack
    started = toolfence({**env, "TOOLFENCE_TURN_SURFACE": "chta"}, "serve", "--port", "0")
    # Then it does not start (every turn would be a 503): one line, exit 2
    assert started.returncode == 2, started.stderr
    assert started.stderr.splitlines() == [
        "toolfence: TOOLFENCE_TURN_SURFACE: TOOLFENCE_TOOLS declares no such surface "
        "(declared: 'chat', 'lookup')"
    ]
