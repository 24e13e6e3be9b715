"""Fixtures for `toolfence serve`: a real uvicorn server on a private port, over a
private PostgreSQL database with the reference ledger's tools and accounts.

`served` runs the app in this process (a thread), so a test can read the database
beside it; the SIGTERM and console tests start `toolfence serve` as a subprocess.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import Engine

from executor.http.keys import KeyScope, create_key
from executor.http.server import HttpSettings, create_app
from executor.settings import Settings
from executor.store.engine import make_engine
from ledger import service as ledger_service
from ledger import tools as ledger_tools
from ledger.service import Ledger


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    url: str
    engine: Engine
    settings: Settings

    def key(
        self, tenant: str, principal: str, *scopes: KeyScope, roles: tuple[str, ...] = ("member",)
    ) -> str:
        with self.engine.begin() as conn:
            return create_key(conn, tenant=tenant, principal=principal, roles=roles, scopes=scopes)

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture
def book(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    ledger = Ledger(pg_url)
    # The tools' hooks reach the ledger through `default_ledger()`: this test's one.
    monkeypatch.setattr(ledger_service, "_default", ledger)
    ledger.create_schema()
    ledger.open_account("acme-1", "acme", 1_000_000)
    ledger.open_account("acme-2", "acme", 0)
    ledger.open_account("globex-1", "globex", 500)
    yield ledger
    ledger.engine.dispose()


def start_in_thread(app: object, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start")
        time.sleep(0.02)
    return server, thread


@pytest.fixture
def served_with(pg_url: str, book: Ledger, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """A factory: `served_with(http=HttpSettings(...))` starts a server (stopped at teardown)."""
    running: list[tuple[uvicorn.Server, threading.Thread, Engine]] = []

    def start(http: HttpSettings | None = None) -> Served:
        settings = Settings(database_url=pg_url, broker_url=f"filesystem://{tmp_path / 'broker'}")
        engine = make_engine(pg_url)
        http = http or HttpSettings(session_secret=b"s" * 32, rate_limit="10000/minute")
        app = create_app(settings, ledger_tools.registry, http=http, engine=engine)
        port = free_port()
        server, thread = start_in_thread(app, port)
        running.append((server, thread, engine))
        return Served(f"http://127.0.0.1:{port}", engine, settings)

    yield start
    for server, thread, engine in running:
        server.should_exit = True
        thread.join(timeout=10)
        engine.dispose()


@pytest.fixture
def served(served_with: Callable[..., Served]) -> Served:
    return served_with()


def serve_subprocess(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """`toolfence serve` as a real process, waited for until /healthz answers."""
    process = subprocess.Popen(
        [sys.executable, "-m", "executor.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise AssertionError(f"toolfence serve exited {process.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"toolfence serve did not answer: {log.read_text()}")
        time.sleep(0.1)
