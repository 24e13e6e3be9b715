"""One settings object, read from the environment (TOOLFENCE_*)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from executor.core.admission import DEFAULT_MAX_ARGUMENT_BYTES, DEFAULT_MAX_ARGUMENT_DEPTH, Limits
from executor.core.budgets import BudgetLimits, Budgets, Scope


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


def budgets_from_env() -> Budgets:
    """TOOLFENCE_BUDGET_<SCOPE>_<LIMIT> (e.g. TOOLFENCE_BUDGET_REQUEST_MAX_CALLS), and
    TOOLFENCE_BUDGET_TENANTS: JSON {tenant: {"request_max_calls": 10, ...}}, each
    tenant's limits being these with the keys it names replaced."""
    defaults = Budgets()
    scopes = {}
    for scope in Scope:
        base = defaults.limits(scope)
        values = {
            f.name: _int(f"TOOLFENCE_BUDGET_{scope.value}_{f.name}".upper(), getattr(base, f.name))
            for f in fields(BudgetLimits)
        }
        try:
            scopes[scope.value] = BudgetLimits(**values)
        except ValueError as exc:
            raise SettingsError(f"TOOLFENCE_BUDGET_{scope.value.upper()}_*: {exc}") from None
    budgets = Budgets(request=scopes["request"], conversation=scopes["conversation"])
    raw = os.environ.get("TOOLFENCE_BUDGET_TENANTS", "")
    if not raw.strip():
        return budgets
    try:
        per_tenant = json.loads(raw)
        if not isinstance(per_tenant, dict) or not all(isinstance(v, dict) for v in per_tenant.values()):
            raise ValueError("expected {tenant: {limit: number}}")
        tenants = {str(t): budgets.with_overrides(v) for t, v in per_tenant.items()}
    except (ValueError, TypeError) as exc:
        raise SettingsError(f"TOOLFENCE_BUDGET_TENANTS: {exc}") from None
    return replace(budgets, tenants=tenants)


def limits_from_env() -> Limits:
    """The parse gate's limits: TOOLFENCE_MAX_ARGUMENT_BYTES and
    TOOLFENCE_MAX_ARGUMENT_DEPTH (each at least 1)."""
    limits = Limits(
        max_argument_bytes=_int("TOOLFENCE_MAX_ARGUMENT_BYTES", DEFAULT_MAX_ARGUMENT_BYTES),
        max_argument_depth=_int("TOOLFENCE_MAX_ARGUMENT_DEPTH", DEFAULT_MAX_ARGUMENT_DEPTH),
    )
    if limits.max_argument_bytes < 1 or limits.max_argument_depth < 1:
        raise SettingsError("TOOLFENCE_MAX_ARGUMENT_BYTES and TOOLFENCE_MAX_ARGUMENT_DEPTH must be >= 1")
    return limits


def _choice(name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (the first when unset)."""
    value = os.environ.get(name) or choices[0]
    if value not in choices:
        raise SettingsError(f"{name}={value!r}: one of {', '.join(choices)}")
    return value


def _turn_scope() -> str:
    return _choice("TOOLFENCE_TURN_SCOPE", ("principal", "conversation"))


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
    max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES
    max_argument_depth: int = DEFAULT_MAX_ARGUMENT_DEPTH
    metrics_dir: str | None = None
    tools_module: str = "ledger.tools:registry"
    # `module:attribute` naming the application's HostedPolicy; None: no hosted tool
    # may run (NO_HOSTED_TOOLS), so every provider-run call is reported.
    hosted_policy: str | None = None
    fault_points: frozenset[str] = field(default_factory=frozenset)
    budgets: Budgets = field(default_factory=Budgets)
    # Turns: the default driver spec, what "one running turn" counts over
    # (`principal` or `conversation`), the default step limit, and how long a turn
    # job waits for its calls before it gives its worker back and reschedules itself.
    turn_driver: str | None = None
    turn_scope: str = "principal"
    turn_when_busy: str = "refuse"
    turn_max_steps: int = 8
    turn_wait_seconds: float = 10.0

    @property
    def visibility_timeout_seconds(self) -> float:
        # Well above the hard time limit: a broker must not redeliver a message whose
        # worker is still legitimately running it.
        return max(3 * self.hard_time_limit_seconds, 3600.0)

    @property
    def limits(self) -> Limits:
        """The parse gate's limits these settings name."""
        return Limits(self.max_argument_bytes, self.max_argument_depth)

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
        limits = limits_from_env()
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
            max_argument_bytes=limits.max_argument_bytes,
            max_argument_depth=limits.max_argument_depth,
            metrics_dir=os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None,
            tools_module=os.environ.get("TOOLFENCE_TOOLS", "ledger.tools:registry"),
            hosted_policy=os.environ.get("TOOLFENCE_HOSTED_POLICY") or None,
            fault_points=frozenset(p for p in faults.split(",") if p),
            budgets=budgets_from_env(),
            turn_driver=os.environ.get("TOOLFENCE_TURN_DRIVER") or None,
            turn_scope=_turn_scope(),
            turn_when_busy=_choice("TOOLFENCE_TURN_WHEN_BUSY", ("refuse", "queue")),
            turn_max_steps=_int("TOOLFENCE_TURN_MAX_STEPS", 8),
            turn_wait_seconds=_float("TOOLFENCE_TURN_WAIT_SECONDS", 10.0),
        )
