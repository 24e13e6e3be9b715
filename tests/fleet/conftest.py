"""Fixtures for tests that run a real fleet: PostgreSQL + a real broker + subprocesses.

Every test gets its own PostgreSQL database (cloned from a migrated template), its
own broker queue and its own metrics directory. Workers load
`tests/fleet/fleet_tools.py` (the ledger's tools, instrumented; see there). A test
runs on Redis unless it asks for both brokers with `on_both_brokers`. When a test
fails, the logs of every fleet it started are attached to its report.
"""

from __future__ import annotations

import os
import signal
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import fleet_tools
import pytest

from executor.cli.fleet import Fleet
from executor.settings import Settings
from ledger import service as ledger_service
from ledger.service import Ledger

REDIS_URL = os.environ.get("TOOLFENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("TOOLFENCE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
FLEET_TESTS_DIR = Path(__file__).resolve().parent

_FLEETS = pytest.StashKey[list[Fleet]]()


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
def fleet_env(pg_url: str, broker_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    queue = f"tf-test-{uuid.uuid4().hex[:10]}"
    python_path = os.pathsep.join(
        p for p in (str(FLEET_TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p
    )
    yield {
        "TOOLFENCE_DATABASE_URL": pg_url,
        "TOOLFENCE_BROKER_URL": broker_url,
        # A queue per test: leftovers of one test never reach another's workers.
        "TOOLFENCE_QUEUE": queue,
        "TOOLFENCE_LEASE_SECONDS": "2",
        "TOOLFENCE_RELAY_POLL_SECONDS": "0.05",
        "TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS": "5",
        "TOOLFENCE_HOME": str(tmp_path / "home"),
        "PROMETHEUS_MULTIPROC_DIR": str(_metrics_dir(tmp_path)),
        # The instrumented registry (tests/fleet/fleet_tools.py), importable by workers.
        "TOOLFENCE_TOOLS": "fleet_tools:registry",
        "PYTHONPATH": python_path,
        fleet_tools.POLICY_FILE_ENV: str(tmp_path / "policy.json"),
    }
    _delete_queue(broker_url, queue)


def _delete_queue(broker_url: str, queue: str) -> None:
    """Leave no per-test queue (nor Celery's exchange of the same name) on the broker."""
    from kombu import Connection, Exchange, Queue

    try:
        with Connection(broker_url, connect_timeout=2) as conn:
            Queue(queue).bind(conn.default_channel).delete()
            Exchange(queue).bind(conn.default_channel).delete()
    except Exception:
        pass  # best effort: a leftover queue is harmless, its name is unique


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
def ledger(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    book = Ledger(settings.database_url)
    # The tools' hooks reach the ledger through `default_ledger()`, cached per process:
    # in this (producer) process it must be this test's ledger, not an earlier test's.
    monkeypatch.setattr(ledger_service, "_default", book)
    book.create_schema()
    fleet_tools.create_schema(book.engine)
    book.open_account("acme-1", "acme", 10_000_000)
    book.open_account("acme-2", "acme", 0)
    book.open_account("globex-1", "globex", 500)
    yield book
    book.engine.dispose()


@pytest.fixture
def make_fleet(
    fleet_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Fleet]]:
    fleets: list[Fleet] = []
    request.node.stash[_FLEETS] = fleets

    def factory(**kwargs: object) -> Fleet:
        env = {**fleet_env, **{k: str(v) for k, v in kwargs.pop("env", {}).items()}}  # type: ignore[attr-defined]
        fleet = Fleet(env=env, log_dir=tmp_path / f"logs-{len(fleets)}", **kwargs)  # type: ignore[arg-type]
        fleets.append(fleet)
        return fleet

    yield factory
    for fleet in fleets:
        # No graceful shutdown needed after a test: kill every process group now
        # (SIGCONT first, for members a test left stopped), then reap.
        for member in fleet.members:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(member.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        fleet.stop(timeout=5)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach every fleet's logs to a failed test's report (fleets are still up here)."""
    report = yield
    if report.failed:
        for index, fleet in enumerate(item.stash.get(_FLEETS, [])):
            report.sections.append((f"fleet {index} logs", fleet.logs()))
    return report
