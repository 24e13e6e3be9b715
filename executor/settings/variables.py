"""Every setting toolfence reads, declared once: name, type, default, help, secrecy.

Nothing else in the library reads a `TOOLFENCE_*` variable: it asks this table
(through `executor.settings`), so a bad value is refused at start with one line
naming the variable, and `toolfence config` can list them all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from executor.core.argument_limits import DEFAULT_MAX_ARGUMENT_BYTES, DEFAULT_MAX_ARGUMENT_DEPTH
from executor.core.budgets import BudgetLimits, Budgets, Scope
from executor.errors import ConfigurationError


class SettingsError(ConfigurationError, ValueError):
    """A setting has a value it may not take (the message names the variable)."""


# What a value is. Each kind parses the text of an environment variable (or of a
# settings file's value, written out the same way).
TEXT = "text"
INTEGER = "integer"
NUMBER = "number"
CHOICE = "choice"
NAMES = "names"  # comma-separated
JSON = "json"
URL = "url"  # text whose password is masked when shown


Default = Callable[[Mapping[str, Any]], Any]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str
    # A value, or a function of the values declared before it (the database URL
    # lives under TOOLFENCE_HOME unless set).
    default: Any
    help: str
    # Shown masked by `toolfence config`: the whole value.
    secret: bool = False
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    # True: the value must be greater than `minimum`, not equal to it.
    above: bool = False
    # An empty value means "unset" (the default), except where empty is an error.
    blank_is_default: bool = True
    # False: only the environment may set it (the settings file's own path).
    in_file: bool = True

    @property
    def key(self) -> str:
        """The variable's key in a settings file: `lease_seconds` for TOOLFENCE_LEASE_SECONDS."""
        return self.name.removeprefix("TOOLFENCE_").lower()

    def default_for(self, earlier: Mapping[str, Any]) -> Any:
        return self.default(earlier) if callable(self.default) else self.default

    def parse(self, raw: str) -> Any:
        """The value `raw` stands for; SettingsError (one line naming the variable) if none."""
        if self.kind == INTEGER:
            try:
                value: Any = int(raw)
            except ValueError:
                raise SettingsError(f"{self.name}={raw!r} is not an integer") from None
            self._check_minimum(raw, value)
            return value
        if self.kind == NUMBER:
            try:
                value = float(raw)
            except ValueError:
                raise SettingsError(f"{self.name}={raw!r} is not a number") from None
            if not math.isfinite(value):
                raise SettingsError(f"{self.name}={raw!r} is not a finite number")
            self._check_minimum(raw, value)
            return value
        if self.kind == CHOICE:
            if raw not in self.choices:
                raise SettingsError(f"{self.name}={raw!r}: one of {', '.join(self.choices)}")
            return raw
        if self.kind == NAMES:
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if self.kind == JSON:
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise SettingsError(f"{self.name}: {exc}") from None
        return raw

    def _check_minimum(self, raw: str, value: float) -> None:
        if self.minimum is None:
            return
        if self.above and not value > self.minimum:
            floor = "positive" if self.minimum == 0 else f"> {self.minimum:g}"
            raise SettingsError(f"{self.name}={raw!r} must be {floor}")
        if not self.above and value < self.minimum:
            raise SettingsError(f"{self.name}={raw!r} must be >= {self.minimum:g}")

    def shown(self, value: Any) -> str:
        """The value as `toolfence config` prints it: a secret masked, a URL without its password."""
        if value is None or value == "" or value == ():
            return "(unset)"
        if self.secret:
            return "***"
        if self.kind == URL:
            return mask_url(str(value))
        if self.kind == NAMES:
            return ",".join(value)
        if self.kind == JSON:
            return json.dumps(value, sort_keys=True)
        return str(value)


def mask_url(url: str) -> str:
    """The URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://{user}@{host}"
    return url


def _home(earlier: Mapping[str, Any]) -> str:
    return str(Path.cwd() / ".toolfence")


def _database_url(earlier: Mapping[str, Any]) -> str:
    return f"sqlite:///{Path(earlier['TOOLFENCE_HOME']) / 'toolfence.db'}"


def _broker_url(earlier: Mapping[str, Any]) -> str:
    return f"filesystem://{Path(earlier['TOOLFENCE_HOME']) / 'broker'}"


def _budget_variables() -> list[Variable]:
    defaults = Budgets()
    return [
        Variable(
            f"TOOLFENCE_BUDGET_{scope.value}_{f.name}".upper(), INTEGER,
            getattr(defaults.limits(scope), f.name),
            f"budget: {f.name.replace('_', ' ')} per {scope.value}", minimum=0,
        )
        for scope in Scope
        for f in fields(BudgetLimits)
    ]


DECLARED: tuple[Variable, ...] = (
    Variable(
        "TOOLFENCE_CONFIG", TEXT, None,
        "a TOML settings file (keys: the names below without TOOLFENCE_, lower case); "
        "the environment overrides it",
        in_file=False,
    ),
    # Where things live
    Variable("TOOLFENCE_HOME", TEXT, _home, "home of the embedded defaults (SQLite file, broker folder)"),
    Variable(
        "TOOLFENCE_DATABASE_URL", URL, _database_url,
        "postgresql+psycopg://… or sqlite:///path (default: SQLite under TOOLFENCE_HOME)",
    ),
    Variable(
        "TOOLFENCE_BROKER_URL", URL, _broker_url,
        "redis://…, amqp://… or filesystem://dir (default: a folder under TOOLFENCE_HOME)",
    ),
    Variable("TOOLFENCE_QUEUE", TEXT, "toolfence", "the broker queue workers consume"),
    Variable(
        "TOOLFENCE_BROKER_QUEUE_TYPE", CHOICE, "classic",
        "RabbitMQ only: the queue's x-queue-type (quorum: replicated by Raft across a cluster)",
        choices=("classic", "quorum"),
    ),
    Variable(
        "TOOLFENCE_TOOLS", TEXT, None,
        "module:attribute of the tool Registry (required by commands that run or admit tools)",
    ),
    Variable(
        "TOOLFENCE_HOSTED_POLICY", TEXT, None,
        "module:attribute of the HostedPolicy (unset: every provider-run call is reported)",
    ),
    # The worker, relay and reconciler
    Variable("TOOLFENCE_LEASE_SECONDS", NUMBER, 10.0, "a worker's lease on an operation"),
    Variable(
        "TOOLFENCE_HARD_TIME_LIMIT_SECONDS", NUMBER, 60.0, "Celery's hard time limit per task",
    ),
    Variable("TOOLFENCE_RELAY_BATCH_SIZE", INTEGER, 100, "outbox rows per relay pass"),
    Variable("TOOLFENCE_RELAY_POLL_SECONDS", NUMBER, 0.2, "the relay's wait between empty passes"),
    Variable(
        "TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS", NUMBER, 30.0,
        "a queued operation not taken for this long is republished",
    ),
    Variable("TOOLFENCE_RECONCILE_BATCH_SIZE", INTEGER, 500, "operations per reconciler sweep"),
    # Admission
    Variable(
        "TOOLFENCE_MAX_ARGUMENT_BYTES", INTEGER, DEFAULT_MAX_ARGUMENT_BYTES,
        "the parse gate: largest arguments of one call", minimum=1,
    ),
    Variable(
        "TOOLFENCE_MAX_ARGUMENT_DEPTH", INTEGER, DEFAULT_MAX_ARGUMENT_DEPTH,
        "the parse gate: deepest nesting of one call's arguments", minimum=1,
    ),
    *_budget_variables(),
    Variable(
        "TOOLFENCE_BUDGET_TENANTS", JSON, None,
        'per-tenant budgets, JSON {tenant: {"request_max_calls": 10, ...}}',
    ),
    # Turns
    Variable("TOOLFENCE_TURN_DRIVER", TEXT, None, "the default model driver of a turn (scripted:FILE, …)"),
    Variable(
        "TOOLFENCE_TURN_SURFACE", TEXT, None,
        "the turn surface of a turn that names none (start_turn, the CLI, serve under a key without one)",
    ),
    Variable(
        "TOOLFENCE_TURN_SCOPE", CHOICE, "principal", "what one running turn counts over",
        choices=("principal", "conversation"),
    ),
    Variable(
        "TOOLFENCE_TURN_WHEN_BUSY", CHOICE, "refuse", "a second turn while one runs: refuse or queue",
        choices=("refuse", "queue"),
    ),
    Variable("TOOLFENCE_TURN_MAX_STEPS", INTEGER, 8, "model steps of a turn by default"),
    Variable(
        "TOOLFENCE_TURN_WAIT_SECONDS", NUMBER, 10.0,
        "how long a turn job waits for its calls before it reschedules itself",
    ),
    Variable(
        "TOOLFENCE_TURN_CLI_ENV_ALLOW", NAMES, (),
        "environment variables a cli: agent may see besides PATH, HOME, …",
    ),
    # Eval (`toolfence eval`)
    Variable(
        "TOOLFENCE_EVAL_FIXTURES", TEXT, None,
        "the eval fixtures file whose declared tools executor.eval.declared:registry builds",
    ),
    # Logs
    Variable(
        "TOOLFENCE_LOG_FORMAT", CHOICE, "text",
        "log records as text lines, or one JSON object a line with the correlation ids",
        choices=LOG_FORMATS,
    ),
    Variable(
        "TOOLFENCE_LOG_LEVEL", CHOICE, None,
        "the least severe record logged (unset: warning; -v: info)", choices=LOG_LEVELS,
    ),
    # The database pool
    Variable("TOOLFENCE_DB_POOL_SIZE", INTEGER, 5, "PostgreSQL connections per process pool"),
    Variable(
        "TOOLFENCE_DB_PING_IDLE_SECONDS", NUMBER, 1.0,
        "a pooled connection idle this long is pinged at checkout (0: at every checkout)",
        minimum=0, blank_is_default=False,
    ),
    # toolfence serve
    Variable("TOOLFENCE_HTTP_MAX_BODY_BYTES", NUMBER, 1024 * 1024, "largest request body"),
    Variable("TOOLFENCE_HTTP_RATE_LIMIT", TEXT, "600/minute", "requests per API key (limits' notation)"),
    Variable(
        "TOOLFENCE_HTTP_AUTH_FAILURE_LIMIT", TEXT, "30/minute",
        "failed authentications per client address (limits' notation)",
    ),
    Variable(
        "TOOLFENCE_HTTP_RATE_LIMIT_STORAGE", URL, "memory://",
        "where rate-limit counters live (memory://, redis://…)",
    ),
    Variable(
        "TOOLFENCE_HTTP_SESSION_SECRET", TEXT, None,
        "signs console sessions (unset: a random one per process)", secret=True,
    ),
    Variable("TOOLFENCE_HTTP_SESSION_SECONDS", NUMBER, 8 * 3600.0, "a console session's lifetime"),
    Variable(
        "TOOLFENCE_HTTP_DRAIN_SECONDS", NUMBER, 30.0, "how long SIGTERM waits for requests in flight",
    ),
    Variable(
        "TOOLFENCE_HTTP_WORKERS", INTEGER, 1,
        "server processes sharing the port (more than 1: the rate limits need redis:// storage)",
        minimum=1,
    ),
    Variable(
        "TOOLFENCE_HTTP_THREADS", INTEGER, 8,
        "threads per server process for database work, and that process's PostgreSQL connections",
        minimum=1,
    ),
    # toolfence metrics
    Variable(
        "TOOLFENCE_METRICS_HOST", TEXT, "127.0.0.1",
        "the address `toolfence metrics` listens on (0.0.0.0: every interface)",
    ),
    Variable("TOOLFENCE_METRICS_PORT", INTEGER, 9464, "the port `toolfence metrics` listens on", minimum=0),
    Variable(
        "TOOLFENCE_EXPORTER_STUCK_AFTER_SECONDS", NUMBER, 600.0, "an operation overdue this long is stuck",
        minimum=0, above=True,
    ),
    Variable(
        "TOOLFENCE_EXPORTER_INVARIANT_WINDOW_SECONDS", NUMBER, 3600.0,
        "the invariant gauges look at this much recent history", minimum=0, above=True,
    ),
    Variable(
        "TOOLFENCE_EXPORTER_INVARIANT_INTERVAL_SECONDS", NUMBER, 60.0,
        "from the end of one invariant pass to the start of the next", minimum=0, above=True,
    ),
    Variable(
        "TOOLFENCE_EXPORTER_STATEMENT_TIMEOUT_SECONDS", NUMBER, 10.0, "bound on one scrape's queries",
        minimum=0, above=True,
    ),
    Variable(
        "TOOLFENCE_EXPORTER_CONNECT_TIMEOUT_SECONDS", NUMBER, 5.0, "bound on a scrape's connecting",
        minimum=0, above=True,
    ),
    Variable(
        "PROMETHEUS_MULTIPROC_DIR", TEXT, None,
        "prometheus_client's directory for the counters of several processes",
    ),
    # The sandbox of `sandbox.run_python` (executor/sandbox, docs/tools.md)
    Variable(
        "TOOLFENCE_SANDBOX_BWRAP", TEXT, "bwrap",
        "the bubblewrap executable (a name looked up in PATH, or a path)",
    ),
    Variable(
        "TOOLFENCE_SANDBOX_PYTHON", TEXT, "/usr/bin/python3",
        "the interpreter that runs sandboxed programs (under /usr: the only runtime the sandbox mounts)",
    ),
    Variable(
        "TOOLFENCE_SANDBOX_HOST_UID", INTEGER, 65534,
        "the host uid and gid a root worker runs bubblewrap as (never root; unused when not root)",
        minimum=1,
    ),
    Variable(
        "TOOLFENCE_SANDBOX_MAX_TIMEOUT_SECONDS", NUMBER, 10.0,
        "the longest wall-clock time a sandboxed program may ask for", minimum=0, above=True,
    ),
    Variable(
        "TOOLFENCE_SANDBOX_MAX_MEMORY_MB", INTEGER, 512,
        "the most address space (MiB) a sandboxed program may ask for", minimum=64,
    ),
    # Fault injection (tests and the chaos campaign)
    Variable("TOOLFENCE_FAULT_POINTS", NAMES, (), "fault points: point[:tool]=action[@probability], …"),
    Variable("TOOLFENCE_FAULT_POINTS_FILE", TEXT, None, "a file of fault points, re-read when it changes"),
    Variable("TOOLFENCE_FAULT_LOG", TEXT, None, "a file each fault that fired is appended to"),
)

VARIABLES: dict[str, Variable] = {v.name: v for v in DECLARED}
BY_KEY: dict[str, Variable] = {v.key: v for v in DECLARED if v.in_file}
