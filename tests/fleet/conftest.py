"""Fixtures for tests that run a real fleet: PostgreSQL + a real broker + subprocesses."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from executor.fleet import Fleet
from executor.settings import Settings
from ledger.service import Ledger

REDIS_URL = os.environ.get("TOOLFENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("TOOLFENCE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    if not _reachable(host, port):  # pragma: no cover - CI starts them
        pytest.fail(f"{name} at {host}:{port} is required and not reachable")


@pytest.fixture(params=["redis"])
def broker_url(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        require_service("Redis", "127.0.0.1", 6379)
        return REDIS_URL
    require_service("RabbitMQ", "127.0.0.1", 5672)
    return AMQP_URL


@pytest.fixture
def fleet_env(pg_url: str, broker_url: str, tmp_path: Path) -> dict[str, str]:
    return {
        "TOOLFENCE_DATABASE_URL": pg_url,
        "TOOLFENCE_BROKER_URL": broker_url,
        # A queue per test: leftovers of one test never reach another's workers.
        "TOOLFENCE_QUEUE": f"tf-test-{uuid.uuid4().hex[:10]}",
        "TOOLFENCE_LEASE_SECONDS": "2",
        "TOOLFENCE_RELAY_POLL_SECONDS": "0.05",
        "TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS": "5",
        "TOOLFENCE_HOME": str(tmp_path / "home"),
        "PROMETHEUS_MULTIPROC_DIR": str(_metrics_dir(tmp_path)),
    }


def _metrics_dir(tmp_path: Path) -> Path:
    path = tmp_path / "metrics"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def settings(fleet_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key, value in fleet_env.items():
        monkeypatch.setenv(key, value)
    return Settings.from_env()


@pytest.fixture
def ledger(settings: Settings) -> Iterator[Ledger]:
    book = Ledger(settings.database_url)
    book.create_schema()
    book.open_account("acme-1", "acme", 10_000_000)
    book.open_account("acme-2", "acme", 0)
    book.open_account("globex-1", "globex", 500)
    yield book
    book.engine.dispose()


@pytest.fixture
def make_fleet(fleet_env: dict[str, str], tmp_path: Path) -> Iterator[object]:
    fleets: list[Fleet] = []

    def factory(**kwargs: object) -> Fleet:
        env = {**fleet_env, **{k: str(v) for k, v in kwargs.pop("env", {}).items()}}  # type: ignore[attr-defined]
        fleet = Fleet(env=env, log_dir=tmp_path / f"logs-{len(fleets)}", **kwargs)  # type: ignore[arg-type]
        fleets.append(fleet)
        return fleet

    yield factory
    for fleet in fleets:
        fleet.stop()
