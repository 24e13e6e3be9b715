"""Where the demo runs: a fresh directory, database and queue per run, removed after."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from executor.cli.demo.constants import (
    LEDGER_LATENCY_MS,
    RELAY_POLL_SECONDS,
    REQUEUE_QUEUED_AFTER_SECONDS,
    TURN_FAULT,
    TURN_WAIT_SECONDS,
    DemoError,
)
from executor.settings import Settings
from executor.store.engine import normalize_url


@dataclass
class Place:
    """Where this run lives: a fresh directory, database and queue."""

    run_dir: Path
    database_url: str
    broker_url: str
    queue: str
    created_database: str | None = None  # PostgreSQL: dropped at the end
    admin_url: str | None = None

    @property
    def on_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def on_filesystem_broker(self) -> bool:
        return self.broker_url.startswith("filesystem://")

    def fleet_env(self, lease_seconds: float) -> dict[str, str]:
        from ledger.service import LATENCY_ENV

        return {
            "TOOLFENCE_HOME": str(self.run_dir),
            "TOOLFENCE_DATABASE_URL": self.database_url,
            "TOOLFENCE_BROKER_URL": self.broker_url,
            "TOOLFENCE_QUEUE": self.queue,
            "TOOLFENCE_TOOLS": "ledger.tools:registry",
            "TOOLFENCE_FAULT_POINTS": TURN_FAULT,
            "TOOLFENCE_TURN_WAIT_SECONDS": f"{TURN_WAIT_SECONDS:g}",
            "TOOLFENCE_LEASE_SECONDS": f"{lease_seconds:g}",
            "TOOLFENCE_RELAY_POLL_SECONDS": f"{RELAY_POLL_SECONDS:g}",
            "TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS": f"{REQUEUE_QUEUED_AFTER_SECONDS:g}",
            LATENCY_ENV: str(LEDGER_LATENCY_MS),  # the example downstream's own knob
            # The workers' own counters, kept apart from any other deployment's.
            "PROMETHEUS_MULTIPROC_DIR": str(self.run_dir / "metrics"),
        }

    def describe(self) -> str:
        database = (
            f"SQLite {self.database_url[len('sqlite:///'):]}"
            if self.on_sqlite
            else f"PostgreSQL database {self.created_database} (created for this run, dropped after)"
        )
        broker = (
            "kombu filesystem transport"
            if self.on_filesystem_broker
            else f"{self.broker_url.split('://', 1)[0]} queue {self.queue}"
        )
        return f"{database} · {broker}"


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def prepare_place(settings: Settings) -> Place:
    """A fresh directory, and a fresh database and queue when servers are configured
    (the embedded defaults, under TOOLFENCE_HOME, are replaced by the run's own)."""
    stamp = _stamp()
    run_dir = Path(settings.home) / f"demo-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "metrics").mkdir()
    configured_db = settings.database_url
    configured_broker = settings.broker_url
    broker_url = configured_broker
    if configured_broker.startswith("filesystem://"):
        broker_url = f"filesystem://{run_dir / 'broker'}"  # never reuse an old folder's messages
    queue = f"toolfence-demo-{stamp}"
    if configured_db.startswith("sqlite"):
        # An explicitly configured SQLite file is not reused either: a fresh file per run.
        return Place(run_dir, f"sqlite:///{run_dir / 'toolfence.db'}", broker_url, queue)
    admin_url = normalize_url(configured_db)
    base = make_url(admin_url)
    name = re.sub(r"[^a-z0-9_]", "_", f"{base.database or 'toolfence'}_demo_{stamp}".lower())[:63]
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError as exc:
        reason = str(exc.orig if isinstance(exc, DBAPIError) and exc.orig else exc).strip().splitlines()[0]
        if isinstance(exc, OperationalError):
            raise DemoError(f"cannot reach the database: {reason}") from None
        raise DemoError(
            f"cannot create the demo's own database {name} ({reason}): the demo never uses an "
            "existing database's tables, so its role needs CREATEDB"
        ) from None
    finally:
        admin.dispose()
    database_url = base.set(database=name).render_as_string(hide_password=False)
    return Place(run_dir, database_url, broker_url, queue, created_database=name, admin_url=admin_url)


def teardown_place(place: Place) -> list[str]:
    """Drop what only this run used. Returns problems, for one line each."""
    problems: list[str] = []
    if place.created_database and place.admin_url:
        admin = create_engine(place.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{place.created_database}" WITH (FORCE)'))
        except Exception as exc:
            problems.append(f"could not drop database {place.created_database}: {type(exc).__name__}")
        finally:
            admin.dispose()
    if not place.on_filesystem_broker:
        try:
            _forget_queue(place)
        except Exception as exc:
            problems.append(f"could not delete queue {place.queue}: {type(exc).__name__}")
    return problems


def _forget_queue(place: Place) -> None:
    """Delete the run's queue and its bindings from the broker (names are unique to the run)."""
    if place.broker_url.startswith(("redis://", "rediss://")):
        import redis

        client = redis.Redis.from_url(place.broker_url, socket_timeout=5)
        try:
            # The queue list (and its priority lists) and kombu's binding sets for it.
            for key in client.scan_iter(match=f"*{place.queue}*"):
                client.delete(key)
            # Remote-control bindings of this run's workers (node names carry our pid).
            node = f"-{os.getpid()}@"
            for key in client.scan_iter(match="_kombu.binding*pidbox*"):
                for member in client.smembers(key):
                    if node.encode() in member:
                        client.srem(key, member)
        finally:
            client.close()
        return
    from kombu.connection import Connection

    with Connection(place.broker_url, connect_timeout=5) as connection:  # type: ignore[no-untyped-call]
        channel = connection.default_channel
        channel.queue_delete(place.queue)
        channel.exchange_delete(place.queue)


# ---------------------------------------------------------------------- the workload
