"""One settings object, read from the environment (TOOLFENCE_*)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None


class SettingsError(ValueError):
    pass


def default_home() -> Path:
    return Path(os.environ.get("TOOLFENCE_HOME", Path.cwd() / ".toolfence"))


@dataclass(frozen=True)
class Settings:
    database_url: str
    broker_url: str
    lease_seconds: float = 10.0
    hard_time_limit_seconds: float = 60.0
    queue_name: str = "toolfence"
    relay_batch_size: int = 100
    relay_poll_seconds: float = 0.2
    reconcile_queued_after_seconds: float = 30.0
    reconcile_batch_size: int = 500
    max_argument_bytes: int = 64 * 1024
    max_argument_depth: int = 32
    metrics_dir: str | None = None
    tools_module: str = "ledger.tools:registry"
    fault_points: frozenset[str] = field(default_factory=frozenset)

    @property
    def visibility_timeout_seconds(self) -> float:
        # Well above the hard time limit: a broker must not redeliver a message whose
        # worker is still legitimately running it.
        return max(3 * self.hard_time_limit_seconds, 3600.0)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls) -> Settings:
        home = default_home()
        database_url = os.environ.get("TOOLFENCE_DATABASE_URL") or f"sqlite:///{home / 'toolfence.db'}"
        broker_url = os.environ.get("TOOLFENCE_BROKER_URL") or f"filesystem://{home / 'broker'}"
        faults = os.environ.get("TOOLFENCE_FAULT_POINTS", "")
        return cls(
            database_url=database_url,
            broker_url=broker_url,
            lease_seconds=_float("TOOLFENCE_LEASE_SECONDS", 10.0),
            hard_time_limit_seconds=_float("TOOLFENCE_HARD_TIME_LIMIT_SECONDS", 60.0),
            queue_name=os.environ.get("TOOLFENCE_QUEUE", "toolfence"),
            relay_batch_size=_int("TOOLFENCE_RELAY_BATCH_SIZE", 100),
            relay_poll_seconds=_float("TOOLFENCE_RELAY_POLL_SECONDS", 0.2),
            reconcile_queued_after_seconds=_float("TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS", 30.0),
            reconcile_batch_size=_int("TOOLFENCE_RECONCILE_BATCH_SIZE", 500),
            max_argument_bytes=_int("TOOLFENCE_MAX_ARGUMENT_BYTES", 64 * 1024),
            max_argument_depth=_int("TOOLFENCE_MAX_ARGUMENT_DEPTH", 32),
            metrics_dir=os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None,
            tools_module=os.environ.get("TOOLFENCE_TOOLS", "ledger.tools:registry"),
            fault_points=frozenset(p for p in faults.split(",") if p),
        )
