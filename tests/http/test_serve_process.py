"""`toolfence serve` and `toolfence keys` as real processes: the key printed once
and stored as a hash, revocation at once, and SIGTERM draining a long-poll in
flight before exiting 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from servekit import free_port, serve_subprocess
from sqlalchemy import select

from executor.store.schema import api_keys
from ledger.service import Ledger

pytestmark = pytest.mark.slow


def toolfence(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "executor.cli.main", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def env(pg_url: str, book: Ledger, tmp_path: Path) -> dict[str, str]:
    return {
        "TOOLFENCE_DATABASE_URL": pg_url,
        "TOOLFENCE_BROKER_URL": f"filesystem://{tmp_path / 'broker'}",
        "TOOLFENCE_TOOLS": "ledger.tools:registry",
        "TOOLFENCE_HOME": str(tmp_path / "home"),
    }


def test_keys__create_list_revoke__secret_shown_once_and_revocation_immediate(
    env: dict[str, str], pg_url: str, tmp_path: Path
) -> None:
    # Given a key created by the CLI
    created = toolfence(
        env,
        "keys",
        "create",
        "--tenant",
        "acme",
        "--principal",
        "alice",
        "--role",
        "member",
        "--scope",
        "produce,read",
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("tfk_") and len(key.splitlines()) == 1
    # Then the database holds only an argon2id hash of its secret, and `keys list` shows no secret
    from executor.store.engine import make_engine

    engine = make_engine(pg_url)
    with engine.connect() as conn:
        [row] = conn.execute(select(api_keys)).all()
    engine.dispose()
    secret = key.split("_", 2)[2]
    assert row.secret_hash.startswith("$argon2id$") and secret not in row.secret_hash
    listed = toolfence(env, "keys", "list", "--tenant", "acme")
    assert secret not in listed.stdout and row.secret_hash not in listed.stdout
    assert '"scopes": [\n      "produce",\n      "read"\n    ]' in listed.stdout
    # When the server answers with it, and then the key is revoked
    port = free_port()
    server = serve_subprocess(env, port, tmp_path / "serve.log")
    try:
        url = f"http://127.0.0.1:{port}/v1/approvals"
        before = httpx.get(url, headers={"Authorization": f"Bearer {key}"})
        revoked = toolfence(env, "keys", "revoke", row.key_id)
        after = httpx.get(url, headers={"Authorization": f"Bearer {key}"})
        again = toolfence(env, "keys", "revoke", key)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    # Then the next request is refused at once (the row is read on every request)
    assert before.status_code == 200
    assert revoked.returncode == 0 and after.status_code == 401
    assert after.json()["code"] == "unauthenticated"
    assert again.returncode == 1 and "no active key" in again.stderr


def test_serve__sigterm_with_a_long_poll_in_flight__answers_it_and_exits_0(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Given a running server and a request whose read stays queued (no worker runs it)
    key = toolfence(
        env,
        "keys",
        "create",
        "--tenant",
        "acme",
        "--principal",
        "alice",
        "--role",
        "member",
        "--scope",
        "produce",
    ).stdout.strip()
    port = free_port()
    server = serve_subprocess(env, port, tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {key}"}
    posted = httpx.post(
        f"{base}/v1/requests",
        headers=headers,
        json={
            "calls": [
                {"call_id": "c1", "tool_name": "ledger.get_balance", "arguments": {"account_id": "acme-1"}}
            ]
        },
    )
    assert posted.status_code == 202
    request_id = posted.json()["request_id"]
    # And a client long-polling it for up to 25 s
    answer: dict[str, object] = {}

    def long_poll() -> None:
        started = time.monotonic()
        response = httpx.get(
            f"{base}/v1/requests/{request_id}", headers=headers, params={"wait": 25}, timeout=40
        )
        answer.update(status=response.status_code, body=response.json(), after=time.monotonic() - started)

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(1.0)
    # When the server gets SIGTERM
    signalled = time.monotonic()
    server.send_signal(signal.SIGTERM)
    exit_code = server.wait(timeout=30)
    exited_after = time.monotonic() - signalled
    poller.join(timeout=30)
    # Then the long-poll was answered (what is known now, not settled) and the server exited 0,
    # long before the poll's 25 s were up
    assert answer["status"] == 200, (tmp_path / "serve.log").read_text()
    body = answer["body"]
    assert isinstance(body, dict) and body["settled"] is False and body["calls"][0]["state"] == "queued"
    assert exit_code == 0, (tmp_path / "serve.log").read_text()
    assert exited_after < 10 and float(answer["after"]) < 12  # type: ignore[arg-type]
    # And nothing listens any more
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/healthz", timeout=2)
