"""Fixtures for `toolfence serve`: a real uvicorn server on a private port, over a
private PostgreSQL database with the reference ledger's tools and accounts.

`served` runs the app in this process (a thread), so a test can read the database
beside it; the SIGTERM and console tests start `toolfence serve` as a subprocess
(servekit.serve_subprocess).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn
from servekit import Served, free_port, start_in_thread
from sqlalchemy import Engine

from executor.core.tools import Registry
from executor.http.server import HttpSettings, create_app
from executor.settings import Settings
from executor.store.engine import make_engine
from ledger import service as ledger_service
from ledger import tools as ledger_tools
from ledger.service import Ledger


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


@pytest.fixture
def served_with(pg_url: str, book: Ledger, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """A factory: `served_with(http=HttpSettings(...), turn_driver=...)` starts a server
    (stopped at teardown); keyword arguments besides `http` and `registry` (default:
    the ledger's tools) are Settings fields."""
    running: list[tuple[uvicorn.Server, threading.Thread, Engine]] = []

    def start(
        http: HttpSettings | None = None, registry: Registry | None = None, **settings_fields: object
    ) -> Served:
        settings = Settings(
            database_url=pg_url, broker_url=f"filesystem://{tmp_path / 'broker'}", **settings_fields  # type: ignore[arg-type]
        )
        engine = make_engine(pg_url)
        http = http or HttpSettings(session_secret=b"s" * 32, rate_limit="10000/minute")
        app = create_app(settings, registry or ledger_tools.registry, http=http, engine=engine)
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
def script(tmp_path: Path) -> Path:
    """A scripted model that answers at once (the turns' driver of a server under test)."""
    path = tmp_path / "turn.jsonl"
    path.write_text(json.dumps({"final": "done"}) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def served(served_with: Callable[..., Served]) -> Served:
    return served_with()


@pytest.fixture
def served_sqlite(sqlite_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Served]:
    """The same server on the embedded default's SQLite (what `toolfence demo --serve` uses)."""
    ledger = Ledger(sqlite_url)
    monkeypatch.setattr(ledger_service, "_default", ledger)
    ledger.create_schema()
    ledger.open_account("acme-1", "acme", 1_000_000)
    ledger.open_account("acme-2", "acme", 0)
    settings = Settings(database_url=sqlite_url, broker_url=f"filesystem://{tmp_path / 'broker'}")
    engine = make_engine(sqlite_url)
    app = create_app(
        settings,
        ledger_tools.registry,
        engine=engine,
        http=HttpSettings(session_secret=b"s" * 32, rate_limit="10000/minute"),
    )
    port = free_port()
    server, thread = start_in_thread(app, port)
    yield Served(f"http://127.0.0.1:{port}", engine, settings)
    server.should_exit = True
    thread.join(timeout=10)
    engine.dispose()
    ledger.engine.dispose()
