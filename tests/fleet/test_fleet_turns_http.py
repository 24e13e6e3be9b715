"""A turn over HTTP on a real fleet: `toolfence serve` as a subprocess (its turn
driver set by TOOLFENCE_TURN_DRIVER), relay and worker subprocesses, and curl as
the client. The turn's model is the scripted driver (read, write, final)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_fleet_turns import asked, write_script

from executor.cli.fleet import Fleet
from executor.http.keys import KeyScope, create_key
from executor.settings import Settings
from executor.store.engine import make_engine
from ledger.service import Ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))
from servekit import free_port, serve_subprocess  # noqa: E402  (tests/http/servekit.py)

pytestmark = pytest.mark.slow


@pytest.fixture
def script(tmp_path: Path) -> Path:
    return write_script(tmp_path / "turn.jsonl")


@pytest.fixture
def server(
    settings: Settings, ledger: Ledger, fleet_env: dict[str, str], script: Path, tmp_path: Path
) -> Iterator[str]:
    """`toolfence serve` whose turns run on the scripted driver (the server's setting)."""
    port = free_port()
    log = tmp_path / "serve.log"
    process = serve_subprocess({**fleet_env, "TOOLFENCE_TURN_DRIVER": f"scripted:{script}"}, port, log)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()


def curl(*args: str) -> tuple[int, Any]:
    result = subprocess.run(
        ["curl", "-sS", "-w", "\n%{http_code}", *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    body, _, status = result.stdout.rpartition("\n")
    return int(status), json.loads(body)


def test_turn_over_http__curl_posts_a_message__worker_runs_it_and_get_shows_the_write_and_final(
    settings: Settings, ledger: Ledger, server: str, make_fleet: Callable[..., Fleet], script: Path
) -> None:
    # Given a fleet (relay, a worker, reconciler) and a produce key of acme/alice
    assert shutil.which("curl"), "curl is required (the non-Python client)"
    fleet = make_fleet(workers=1, concurrency=2, relays=1, reconcile_every=0.3).start()
    engine = make_engine(settings.database_url)
    with engine.begin() as conn:
        key = create_key(conn, tenant="acme", principal="alice", roles=("member",), scopes=[KeyScope.PRODUCE])
        other = create_key(conn, tenant="globex", principal="gina", roles=("member",), scopes=[KeyScope.READ])
    engine.dispose()
    auth = f"Authorization: Bearer {key}"
    message = json.dumps({"conversation_id": "conv-1", "message": "Credit acme-2 with 5.00"})
    # When curl posts the message as a turn
    status, started = curl("-X", "POST", f"{server}/v1/turns", "-H", auth,
                           "-H", "Content-Type: application/json", "--data-binary", message)
    assert (status, started["state"]) == (202, "running"), started
    # And, while it runs, a second turn of alice is refused
    status, busy = curl("-X", "POST", f"{server}/v1/turns", "-H", auth,
                        "-H", "Content-Type: application/json", "--data-binary", message)
    assert (status, busy["code"]) == (409, "turn_in_progress"), busy
    # And curl long-polls the turn until it has ended
    view: dict[str, Any] = {}
    for _ in range(6):
        status, view = curl("-G", f"{server}/v1/turns/{started['turn_id']}", "-H", auth,
                            "--data-urlencode", "wait=20")
        assert status == 200, view
        if view["terminal"]:
            break
    # Then it succeeded with the model's final text
    assert (view["state"], view["final_output"]) == (
        "succeeded", "acme-2 has been credited 5.00."
    ), fleet.logs()
    assert [s["outcome"] for s in view["steps"]] == ["tool_calls", "tool_calls", "final"]
    # And the write's result is on its step: succeeded, its effect exactly once
    [read] = view["steps"][0]["calls"]
    [credit] = view["steps"][1]["calls"]
    assert (read["tool_name"], read["status"]) == ("ledger.get_balance", "succeeded")
    assert read["output"]["balance_cents"] == 10_000_000
    assert (credit["tool_name"], credit["status"]) == ("ledger.credit", "succeeded")
    assert ledger.effects_per_operation() == {credit["operation_id"]: 1}
    assert ledger.balance("acme-2") == 500
    assert view["steps"][1]["usage"]["model"]
    # And each scripted model call was asked once
    assert asked(script) == {1: 1, 2: 1, 3: 1}
    # And another tenant's key sees no such turn
    status, problem = curl("-G", f"{server}/v1/turns/{started['turn_id']}",
                           "-H", f"Authorization: Bearer {other}")
    assert (status, problem["code"]) == (404, "not_found")
