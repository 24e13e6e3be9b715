"""Fixtures the turn tests share (test_turns, test_turn_ends, test_sanitised_everywhere);
`engine` and `db_url` (SQLite and PostgreSQL) come from tests/conftest.py. A test file
that needs another `settings` or `ledger` defines its own, which wins."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from executor.settings import Settings
from ledger import service as ledger_service
from ledger.service import Ledger


@pytest.fixture
def settings(db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    monkeypatch.setenv("TOOLFENCE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TOOLFENCE_FAULT_POINTS", raising=False)
    monkeypatch.delenv("TOOLFENCE_HOSTED_POLICY", raising=False)
    # Short waits: in one process the operations run between the turn job's passes.
    return Settings.from_env().with_(lease_seconds=1.0, turn_wait_seconds=0.05)


@pytest.fixture
def ledger(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    book = Ledger(db_url)
    monkeypatch.setattr(ledger_service, "_default", book)
    book.create_schema()
    book.open_account("acme-1", "acme", 10_000_000)
    book.open_account("acme-2", "acme", 0)
    yield book
    book.engine.dispose()
