"""One settings object, from the declared variables (`executor/settings/variables.py`).

`Settings.from_env()` reads them now (the environment over the settings file over
the defaults); `current()` is the process's settings, read once and kept, for code
that has no Settings handed to it (admission's limits and budgets); `reload()`
reads them again and `using(settings)` puts another in place for a while (the CLI
for one command, a test that changed the environment).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from executor.core.argument_limits import DEFAULT_MAX_ARGUMENT_BYTES, DEFAULT_MAX_ARGUMENT_DEPTH
from executor.core.budgets import BudgetLimits, Budgets, Scope
from executor.settings.sources import Loaded, load, read, use_config_file
from executor.settings.variables import DECLARED, VARIABLES, SettingsError, Variable, mask_url

if TYPE_CHECKING:
    # Loaded where used: the CLI's parsers read the declarations without admission.
    from executor.core.admission import Limits

__all__ = [
    "DECLARED",
    "VARIABLES",
    "Loaded",
    "Settings",
    "SettingsError",
    "Variable",
    "budgets_from_env",
    "current",
    "default_home",
    "forget",
    "limits_from_env",
    "load",
    "mask_url",
    "read",
    "reload",
    "use_config_file",
    "using",
]


def _budgets(values: Mapping[str, Any]) -> Budgets:
    """TOOLFENCE_BUDGET_<SCOPE>_<LIMIT> (e.g. TOOLFENCE_BUDGET_REQUEST_MAX_CALLS), and
    TOOLFENCE_BUDGET_TENANTS: JSON {tenant: {"request_max_calls": 10, ...}}, each
    tenant's limits being these with the keys it names replaced."""
    scopes = {
        scope.value: BudgetLimits(
            **{
                f.name: values[f"TOOLFENCE_BUDGET_{scope.value}_{f.name}".upper()]
                for f in fields(BudgetLimits)
            }
        )
        for scope in Scope
    }
    budgets = Budgets(request=scopes["request"], conversation=scopes["conversation"])
    per_tenant = values["TOOLFENCE_BUDGET_TENANTS"]
    if per_tenant is None:
        return budgets
    try:
        if not isinstance(per_tenant, dict) or not all(isinstance(v, dict) for v in per_tenant.values()):
            raise ValueError("expected {tenant: {limit: number}}")
        tenants = {str(t): budgets.with_overrides(v) for t, v in per_tenant.items()}
    except (ValueError, TypeError) as exc:
        raise SettingsError(f"TOOLFENCE_BUDGET_TENANTS: {exc}") from None
    return replace(budgets, tenants=tenants)


def budgets_from_env() -> Budgets:
    """The budgets the TOOLFENCE_BUDGET_* settings name, read now."""
    return Settings.from_env().budgets


def limits_from_env() -> Limits:
    """The parse gate's limits: TOOLFENCE_MAX_ARGUMENT_BYTES and
    TOOLFENCE_MAX_ARGUMENT_DEPTH (each at least 1), read now."""
    return Settings.from_env().limits


def default_home() -> Path:
    return Path(read("TOOLFENCE_HOME"))


@dataclass(frozen=True)
class Settings:
    database_url: str
    broker_url: str
    lease_seconds: float = 10.0
    hard_time_limit_seconds: float = 60.0
    queue_name: str = "toolfence"
    # RabbitMQ's x-queue-type of that queue: "classic", or "quorum" (Raft-replicated).
    broker_queue_type: str = "classic"
    relay_batch_size: int = 100
    relay_poll_seconds: float = 0.2
    reconcile_queued_after_seconds: float = 30.0
    reconcile_batch_size: int = 500
    max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES
    max_argument_depth: int = DEFAULT_MAX_ARGUMENT_DEPTH
    metrics_dir: str | None = None
    # `module:attribute` naming the application's tool Registry (TOOLFENCE_TOOLS). No
    # default: "" means unset, and a command that needs tools says so (`require_tools`).
    tools_module: str = ""
    # `module:attribute` naming the application's HostedPolicy; None: no hosted tool
    # may run (NO_HOSTED_TOOLS), so every provider-run call is reported.
    hosted_policy: str | None = None
    fault_points: frozenset[str] = field(default_factory=frozenset)
    fault_points_file: str | None = None
    fault_log: str | None = None
    budgets: Budgets = field(default_factory=Budgets)
    # Turns: the default driver spec, what "one running turn" counts over
    # (`principal` or `conversation`), the default step limit, and how long a turn
    # job waits for its calls before it gives its worker back and reschedules itself.
    turn_driver: str | None = None
    turn_surface: str | None = None
    turn_scope: str = "principal"
    turn_when_busy: str = "refuse"
    turn_max_steps: int = 8
    turn_wait_seconds: float = 10.0
    # TOOLFENCE_HOME: where the embedded defaults (and the demo's runs) live.
    home: str = field(default_factory=lambda: str(Path.cwd() / ".toolfence"))
    # Connections per engine pool (PostgreSQL); `toolfence worker --pool threads`
    # sizes it from its concurrency unless TOOLFENCE_DB_POOL_SIZE says otherwise.
    db_pool_size: int = 5
    # TOOLFENCE_LOG_FORMAT and TOOLFENCE_LOG_LEVEL (None: each command's own default).
    log_format: str = "text"
    log_level: str | None = None

    @property
    def visibility_timeout_seconds(self) -> float:
        # Well above the hard time limit: a broker must not redeliver a message whose
        # worker is still legitimately running it.
        return max(3 * self.hard_time_limit_seconds, 3600.0)

    @property
    def limits(self) -> Limits:
        """The parse gate's limits these settings name."""
        from executor.core.admission import Limits

        return Limits(self.max_argument_bytes, self.max_argument_depth)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    def require_tools(self) -> str:
        """TOOLFENCE_TOOLS, which has no default: one line saying so when unset."""
        if not self.tools_module:
            raise SettingsError(
                "TOOLFENCE_TOOLS is not set: name your tool Registry as module:attribute "
                "(e.g. TOOLFENCE_TOOLS=myapp.tools:registry)"
            )
        return self.tools_module

    @classmethod
    def from_env(cls) -> Settings:
        """The settings the environment (over the settings file) names, read now."""
        return cls.from_loaded(load())

    @classmethod
    def from_loaded(cls, loaded: Loaded) -> Settings:
        v = {name: value.value for name, value in loaded.items()}
        return cls(
            database_url=v["TOOLFENCE_DATABASE_URL"],
            broker_url=v["TOOLFENCE_BROKER_URL"],
            lease_seconds=v["TOOLFENCE_LEASE_SECONDS"],
            hard_time_limit_seconds=v["TOOLFENCE_HARD_TIME_LIMIT_SECONDS"],
            queue_name=v["TOOLFENCE_QUEUE"],
            broker_queue_type=v["TOOLFENCE_BROKER_QUEUE_TYPE"],
            relay_batch_size=v["TOOLFENCE_RELAY_BATCH_SIZE"],
            relay_poll_seconds=v["TOOLFENCE_RELAY_POLL_SECONDS"],
            reconcile_queued_after_seconds=v["TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS"],
            reconcile_batch_size=v["TOOLFENCE_RECONCILE_BATCH_SIZE"],
            max_argument_bytes=v["TOOLFENCE_MAX_ARGUMENT_BYTES"],
            max_argument_depth=v["TOOLFENCE_MAX_ARGUMENT_DEPTH"],
            metrics_dir=v["PROMETHEUS_MULTIPROC_DIR"],
            tools_module=v["TOOLFENCE_TOOLS"] or "",
            hosted_policy=v["TOOLFENCE_HOSTED_POLICY"],
            fault_points=frozenset(v["TOOLFENCE_FAULT_POINTS"]),
            fault_points_file=v["TOOLFENCE_FAULT_POINTS_FILE"],
            fault_log=v["TOOLFENCE_FAULT_LOG"],
            budgets=_budgets(v),
            turn_driver=v["TOOLFENCE_TURN_DRIVER"],
            turn_surface=v["TOOLFENCE_TURN_SURFACE"],
            turn_scope=v["TOOLFENCE_TURN_SCOPE"],
            turn_when_busy=v["TOOLFENCE_TURN_WHEN_BUSY"],
            turn_max_steps=v["TOOLFENCE_TURN_MAX_STEPS"],
            turn_wait_seconds=v["TOOLFENCE_TURN_WAIT_SECONDS"],
            home=v["TOOLFENCE_HOME"],
            db_pool_size=v["TOOLFENCE_DB_POOL_SIZE"],
            log_format=v["TOOLFENCE_LOG_FORMAT"],
            log_level=v["TOOLFENCE_LOG_LEVEL"],
        )


class _Current:
    settings: Settings | None = None


_CURRENT = _Current()


def current() -> Settings:
    """This process's settings: read once, then kept (see `reload`, `using`)."""
    if _CURRENT.settings is None:
        _CURRENT.settings = Settings.from_env()
    return _CURRENT.settings


def reload() -> Settings:
    """Read the settings again and keep them as this process's."""
    _CURRENT.settings = Settings.from_env()
    return _CURRENT.settings


def forget() -> None:
    """Drop this process's settings: the next `current()` reads them again (a test
    harness calls it between tests, whose environments differ)."""
    _CURRENT.settings = None


@contextmanager
def using(settings: Settings) -> Iterator[Settings]:
    """`settings` as this process's until the block ends, then the previous ones again."""
    previous = _CURRENT.settings
    _CURRENT.settings = settings
    try:
        yield settings
    finally:
        _CURRENT.settings = previous
