"""The metrics exporter: worker counters aggregated across processes, plus gauges
computed from the database at scrape time.

Two sources feed one `/metrics` page (`toolfence metrics --port 9464`):

- Counters and histograms of `executor.metrics`, written by prefork workers,
  relays and reconcilers into `PROMETHEUS_MULTIPROC_DIR` (prometheus-client
  multiprocess mode). The exporter sums the files of that directory *and of its
  immediate subdirectories*, so containers that share one volume can each write
  into their own subdirectory (PIDs repeat across containers, and two processes
  writing one `counter_<pid>.db` would overwrite each other's counts).
- Gauges read from the operation store on every scrape (`DatabaseCollector`).
  Each query reads the small active part of the operations table through its
  partial indexes, so a scrape costs the same on a table of a million operations
  as on ten thousand (`bench/scrape_cost.py`). Terminal operations are never
  counted here: their rates come from the counter
  `toolfence_operations_terminal_total`.
- The invariants I1 and I3–I7, judged by passes on a thread of their own
  (`executor.telemetry.invariant_passes`): each pass reads only what was touched
  since the previous one, and a scrape serves the last completed pass. I2, a
  present condition, is counted by every scrape.

A failing database never fails the scrape: the database gauges are left out,
`toolfence_exporter_database_up` drops to 0 and
`toolfence_exporter_scrape_errors_total` grows, and the next scrape tries again.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    create_engine,
    event,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.engine import make_url

from executor.core.states import ACTIVE, SETTLED, State
from executor.errors import ConfigurationError
from executor.settings import Settings, read
from executor.store.clock import db_now
from executor.store.engine import make_engine, normalize_url
from executor.store.invariant_check import INVARIANTS as CHECKED_INVARIANTS
from executor.store.invariant_reader import stuck_queries
from executor.store.invariant_watch import PassResult
from executor.store.schema import (
    ACTIVE_STATES,
    TURN_RUNNING,
    TURN_WAITING_APPROVAL,
    operations,
    outbox,
    turns,
)
from executor.telemetry import metrics
from executor.telemetry.invariant_passes import InvariantPasses, PassStatus

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
"""Where the exporter listens unless told otherwise (TOOLFENCE_METRICS_HOST): it has no
authentication, and its series name tenants, tools and error codes."""

INVARIANTS = CHECKED_INVARIANTS
# States an operation can be stuck in (I2): every active state but
# reconciliation_pending, which is a settled state waiting for a person.
STUCK_STATES = tuple(state.value for state in State if state in ACTIVE - SETTLED)


def _env_float(name: str, default: float) -> float:
    return float(read(name))  # declared (default, must be positive) in executor/settings


@dataclass(frozen=True)
class ExporterConfig:
    """Thresholds of the database gauges (TOOLFENCE_EXPORTER_*)."""

    # An operation counts as stuck (I2) once it is overdue by this much: a started
    # lease expired this long ago, a due queued/retry_wait operation not taken, an
    # approval expired but still pending. Well above the reconciler's period, so a
    # healthy fleet never shows one.
    stuck_after_seconds: float = 600.0
    # The invariants count the operations and calls touched within this window that
    # violate them (`toolfence check --since`, the same code). A violation stays
    # visible for the whole window, far longer than the alert needs to fire;
    # `toolfence check --all` checks all history.
    invariant_window_seconds: float = 3600.0
    # Seconds from the end of one invariant pass to the start of the next: a pass
    # reads what was touched since the previous one began, so its cost follows this
    # interval times the fleet's rate, never the window.
    invariant_interval_seconds: float = 60.0
    # Upper bound on one scrape's queries and on connecting: a slow or absent
    # database makes a failed scrape, never a hung exporter.
    statement_timeout_seconds: float = 10.0
    connect_timeout_seconds: float = 5.0

    @classmethod
    def from_env(cls) -> ExporterConfig:
        return cls(
            stuck_after_seconds=_env_float("TOOLFENCE_EXPORTER_STUCK_AFTER_SECONDS", 600.0),
            invariant_window_seconds=_env_float(
                "TOOLFENCE_EXPORTER_INVARIANT_WINDOW_SECONDS", 3600.0
            ),
            invariant_interval_seconds=_env_float(
                "TOOLFENCE_EXPORTER_INVARIANT_INTERVAL_SECONDS", 60.0
            ),
            statement_timeout_seconds=_env_float(
                "TOOLFENCE_EXPORTER_STATEMENT_TIMEOUT_SECONDS", 10.0
            ),
            connect_timeout_seconds=_env_float("TOOLFENCE_EXPORTER_CONNECT_TIMEOUT_SECONDS", 5.0),
        )


@dataclass(frozen=True)
class DatabaseSnapshot:
    """What one scrape read from the database. Ages are 0 when nothing is waiting."""

    outbox_backlog: int
    outbox_oldest_unpublished_age_seconds: float
    operations_active: Mapping[str, int]
    oldest_started_age_seconds: float
    reconciliation_pending: int
    reconciliation_pending_oldest_age_seconds: float
    operations_stuck: Mapping[str, int]
    approvals_waiting_oldest_age_seconds: float = 0.0
    turns_active: Mapping[str, int] | None = None


# ------------------------------------------------------------------- queries
#
# State names are written into the SQL as literals, not bound parameters: a
# partial index (`WHERE state = 'started'`) is usable only when the planner can
# prove the query's predicate implies the index's, which a generic plan over `$1`
# (psycopg prepares a statement after a few executions) cannot.


def _state_literal(state: str) -> ColumnElement[str]:
    return literal_column(f"'{State(state).value}'")


def _state_is(state: str) -> ColumnElement[bool]:
    return operations.c.state == _state_literal(state)


def _state_in(states: Iterable[str]) -> ColumnElement[bool]:
    return operations.c.state.in_([_state_literal(s) for s in states])


def _age(now: float, oldest: float | None) -> float:
    return 0.0 if oldest is None else max(0.0, now - oldest)


def unpublished_outbox(conn: Connection, now: float) -> tuple[int, float]:
    """Outbox rows not yet published, and the age of the oldest (partial index)."""
    row = conn.execute(
        select(func.count(), func.min(outbox.c.created_at)).where(outbox.c.published_at.is_(None))
    ).one()
    return int(row[0]), _age(now, row[1])


def active_operations(conn: Connection) -> dict[str, int]:
    """Operations per non-terminal state, every state present (index-only on the active index)."""
    counts = dict.fromkeys(ACTIVE_STATES, 0)
    for state, count in conn.execute(
        select(operations.c.state, func.count())
        .where(_state_in(ACTIVE_STATES))
        .group_by(operations.c.state)
    ):
        counts[state] = int(count)
    return counts


def oldest_started_age(conn: Connection, now: float) -> float:
    """Seconds since the longest-running `started` operation was reserved or taken over."""
    oldest = conn.execute(
        select(func.min(operations.c.started_at)).where(_state_is(State.STARTED))
    ).scalar_one()
    return _age(now, oldest)


def oldest_reconciliation_pending_age(conn: Connection, now: float) -> float:
    """Seconds the oldest `reconciliation_pending` operation has waited for a person.

    Nothing updates such a row but `resolve`, so `updated_at` is when it got there,
    and the active index on (state, updated_at) answers with one probe. The IN term
    is redundant on purpose: SQLite uses a partial index only when the query repeats
    the index's WHERE term.
    """
    oldest = conn.execute(
        select(func.min(operations.c.updated_at)).where(
            _state_in(ACTIVE_STATES), _state_is(State.RECONCILIATION_PENDING)
        )
    ).scalar_one()
    return _age(now, oldest)


def oldest_approval_waiting_age(conn: Connection, now: float) -> float:
    """Seconds the oldest `pending_approval` operation has waited since it was admitted.

    `created_at`, not `updated_at`: a refused approver writes a pending → pending
    event that moves `updated_at`, and the call has waited all along. The rows are
    found through the active index (the IN term repeats its WHERE, as above); they
    are the few calls waiting for a person, so reading their `created_at` is cheap.
    """
    oldest = conn.execute(
        select(func.min(operations.c.created_at)).where(
            _state_in(ACTIVE_STATES), _state_is(State.PENDING_APPROVAL)
        )
    ).scalar_one()
    return _age(now, oldest)


TURN_STATES = (TURN_RUNNING, TURN_WAITING_APPROVAL)


def active_turns(conn: Connection) -> dict[str, int]:
    """Turns running and waiting for an approval: each a count on a partial index of
    its state (the state written as a literal, as above, so the planner can use it)."""
    return {
        state: int(conn.execute(
            select(func.count()).select_from(turns)
            .where(turns.c.state == literal_column(f"'{state}'"))
        ).scalar_one())
        for state in TURN_STATES
    }


def stuck_operations(conn: Connection, now: float, stuck_after_seconds: float) -> dict[str, int]:
    """Operations overdue by more than the threshold, per state (I2): the store's
    `stuck_queries`, the ones `toolfence check` lists, counted."""
    return {
        state: int(conn.execute(select(func.count()).select_from(query.subquery())).scalar_one())
        for state, query in stuck_queries(now - stuck_after_seconds).items()
    }


def invariant_counts(stuck: Mapping[str, int], result: PassResult | None) -> dict[str, int]:
    """`toolfence_invariant_violations`: I2 the operations stuck now (this scrape's
    `stuck`), the others what the last completed pass left (`InvariantWatch`),
    which is what `toolfence check --since <window>` counts; before the first pass
    completes only I2 is known, and only I2 is served."""
    counts = {"I2": sum(stuck.values())}
    if result is not None:
        counts.update(result.violations)
    return {code: counts[code] for code in INVARIANTS if code in counts}


def read_snapshot(conn: Connection, config: ExporterConfig) -> DatabaseSnapshot:
    """Every database gauge, against one reading of the database clock."""
    now = float(conn.execute(select(db_now())).scalar_one())
    backlog, outbox_age = unpublished_outbox(conn, now)
    active = active_operations(conn)
    stuck = stuck_operations(conn, now, config.stuck_after_seconds)
    return DatabaseSnapshot(
        outbox_backlog=backlog,
        outbox_oldest_unpublished_age_seconds=outbox_age,
        operations_active=active,
        oldest_started_age_seconds=oldest_started_age(conn, now),
        reconciliation_pending=active[State.RECONCILIATION_PENDING.value],
        reconciliation_pending_oldest_age_seconds=oldest_reconciliation_pending_age(conn, now),
        operations_stuck=stuck,
        approvals_waiting_oldest_age_seconds=oldest_approval_waiting_age(conn, now),
        turns_active=active_turns(conn),
    )


# ------------------------------------------------------------------- engine


class DatabaseMissing(ConfigurationError, RuntimeError):
    """The SQLite database file to scrape does not exist (connecting would create it)."""


def make_scrape_engine(url: str, config: ExporterConfig) -> Engine:
    """An engine for read-only scrapes, with every wait bounded.

    Not `db.get_engine`: that one opens SQLite transactions with BEGIN IMMEDIATE,
    which would take the write lock for every scrape. Here a SQLite scrape is a
    deferred read transaction (a WAL snapshot that never blocks writers), and a
    PostgreSQL scrape a read-only REPEATABLE READ transaction with a statement
    timeout, so every gauge of one scrape comes from one snapshot.
    """
    url = normalize_url(url)
    if url.startswith("sqlite"):
        database = make_url(url).database
        # Connecting would create an empty file at a mistyped path; say what is wrong.
        if database and database != ":memory:" and not Path(database).exists():
            raise DatabaseMissing(f"SQLite database file {database} does not exist")
        engine = create_engine(
            url,
            connect_args={"timeout": config.statement_timeout_seconds, "check_same_thread": False},
        )
        busy_ms = int(config.statement_timeout_seconds * 1000)

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            cursor.execute("PRAGMA query_only=ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN")

        return engine
    return make_engine(
        url,
        connect_args={"connect_timeout": max(1, math.ceil(config.connect_timeout_seconds))},
        pool_size=1,
        max_overflow=1,
        execution_options={"isolation_level": "REPEATABLE READ", "postgresql_readonly": True},
    )


@contextmanager
def read_transaction(engine: Engine, config: ExporterConfig) -> Iterator[Connection]:
    """One read-only transaction of the engine's, each statement bounded (a scrape, a pass)."""
    with engine.connect() as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            timeout_ms = int(config.statement_timeout_seconds * 1000)
            conn.execute(text(f"SET LOCAL statement_timeout = {timeout_ms}"))
            # Every query reads a few thousand rows at most: starting parallel workers
            # would cost more than it saves and take them from the application.
            conn.execute(text("SET LOCAL max_parallel_workers_per_gather = 0"))
        yield conn


def scrape(engine: Engine, config: ExporterConfig) -> DatabaseSnapshot:
    with read_transaction(engine, config) as conn:
        return read_snapshot(conn, config)


# ------------------------------------------------------------------- collectors


class DatabaseCollector(Collector):
    """Computes the database gauges on every collect; never raises.

    Scrapes are serialized: two concurrent scrapers (Prometheus and a person
    with curl) must not double the load on the database. The invariant passes
    (`passes`, started by `start_passes`) have an engine of their own, so a long
    pass never holds up a scrape.
    """

    def __init__(self, database_url: str, config: ExporterConfig) -> None:
        self._database_url = database_url
        self._config = config
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self._errors = 0
        self._pass_engine: Engine | None = None
        self.passes = InvariantPasses(
            self._pass_transaction, config.invariant_window_seconds, config.invariant_interval_seconds
        )

    @contextmanager
    def _pass_transaction(self) -> Iterator[Connection]:
        # Only the passes' thread (one pass at a time) gets here.
        if self._pass_engine is None:
            self._pass_engine = make_scrape_engine(self._database_url, self._config)
        with read_transaction(self._pass_engine, self._config) as conn:
            yield conn

    def start_passes(self) -> None:
        self.passes.start()

    def close(self) -> None:
        self.passes.stop()
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None
        if self._pass_engine is not None:
            self._pass_engine.dispose()

    def describe(self) -> Iterable[Metric]:
        # Names only, without touching the database at registration time.
        return list(self._families(None, 0.0, up=False, errors=0, passes=None))

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            started = time.perf_counter()
            snapshot: DatabaseSnapshot | None = None
            try:
                if self._engine is None:
                    self._engine = make_scrape_engine(self._database_url, self._config)
                snapshot = scrape(self._engine, self._config)
            except Exception as exc:  # any failure is a failed scrape, never a crash
                self._errors += 1
                # The class and first line only: a driver message can be long, never a password.
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                log.warning("database scrape failed: %s: %s", type(exc).__name__, first_line)
            duration = time.perf_counter() - started
            errors = self._errors
        return list(self._families(
            snapshot, duration, up=snapshot is not None, errors=errors, passes=self.passes.status()
        ))

    @staticmethod
    def _families(
        snapshot: DatabaseSnapshot | None, duration: float, *, up: bool, errors: int,
        passes: PassStatus | None,
    ) -> Iterator[Metric]:
        scrape_duration = GaugeMetricFamily(
            "toolfence_exporter_scrape_duration_seconds",
            "Time the last scrape spent reading the database.",
        )
        scrape_duration.add_metric([], duration)
        yield scrape_duration
        scrape_errors = CounterMetricFamily(
            "toolfence_exporter_scrape_errors",
            "Scrapes whose database read failed (the database gauges were left out).",
        )
        scrape_errors.add_metric([], errors)
        yield scrape_errors
        database_up = GaugeMetricFamily(
            "toolfence_exporter_database_up", "1 when the last scrape read the database."
        )
        database_up.add_metric([], 1.0 if up else 0.0)
        yield database_up
        yield from _pass_families(passes)

        backlog = GaugeMetricFamily(
            "toolfence_outbox_backlog", "Outbox rows not yet published to the broker."
        )
        outbox_age = GaugeMetricFamily(
            "toolfence_outbox_oldest_unpublished_age_seconds",
            "Age of the oldest unpublished outbox row (0 when none).",
        )
        active = GaugeMetricFamily(
            "toolfence_operations_active",
            "Operations in each non-terminal state (terminal ones: toolfence_operations_terminal_total).",
            labels=["state"],
        )
        started_age = GaugeMetricFamily(
            "toolfence_oldest_started_age_seconds",
            "Seconds since the oldest started operation was reserved (0 when none).",
        )
        pending = GaugeMetricFamily(
            "toolfence_reconciliation_pending", "Operations waiting for a person to reconcile them."
        )
        pending_age = GaugeMetricFamily(
            "toolfence_reconciliation_pending_oldest_age_seconds",
            "Seconds the oldest reconciliation_pending operation has waited (0 when none).",
        )
        stuck = GaugeMetricFamily(
            "toolfence_operations_stuck",
            "Operations overdue beyond the stuck threshold, by state (their sum is I2).",
            labels=["state"],
        )
        approvals_age = GaugeMetricFamily(
            "toolfence_approvals_waiting_oldest_age_seconds",
            "Seconds the oldest operation waiting for an approval has waited since it was "
            "admitted (0 when none; how many: toolfence_operations_active{state=\"pending_approval\"}).",
        )
        turns_active = GaugeMetricFamily(
            "toolfence_turns_active",
            "Turns running or waiting for an approval (ended ones: toolfence_turns_ended_total).",
            labels=["state"],
        )
        violations = GaugeMetricFamily(
            "toolfence_invariant_violations",
            "Invariant violations I1-I7 found in the database, as `toolfence check` counts them "
            "over the recent window, from the last completed pass (I2: operations stuck now).",
            labels=["invariant"],
        )
        if snapshot is not None:
            backlog.add_metric([], snapshot.outbox_backlog)
            outbox_age.add_metric([], snapshot.outbox_oldest_unpublished_age_seconds)
            for state, count in snapshot.operations_active.items():
                active.add_metric([state], count)
            started_age.add_metric([], snapshot.oldest_started_age_seconds)
            pending.add_metric([], snapshot.reconciliation_pending)
            pending_age.add_metric([], snapshot.reconciliation_pending_oldest_age_seconds)
            for state, count in snapshot.operations_stuck.items():
                stuck.add_metric([state], count)
            approvals_age.add_metric([], snapshot.approvals_waiting_oldest_age_seconds)
            for state, count in (snapshot.turns_active or {}).items():
                turns_active.add_metric([state], count)
            last = passes.last.result if passes is not None and passes.last is not None else None
            for invariant, count in invariant_counts(snapshot.operations_stuck, last).items():
                violations.add_metric([metrics.INVARIANT.admit(invariant)], count)
        yield from (
            backlog, outbox_age, active, started_age, pending, pending_age, stuck, approvals_age,
            turns_active, violations,
        )


def _pass_families(passes: PassStatus | None) -> Iterator[Metric]:
    """The invariant passes' own gauges: an alert fires on the age when passes stop."""
    age = GaugeMetricFamily(
        "toolfence_exporter_invariant_pass_age_seconds",
        "Seconds since the last invariant pass completed (since the exporter started, before the "
        "first): the invariant gauges are this old.",
    )
    duration = GaugeMetricFamily(
        "toolfence_exporter_invariant_pass_duration_seconds",
        "Time the last completed invariant pass took.",
    )
    judged = GaugeMetricFamily(
        "toolfence_exporter_invariant_pass_judged",
        "Operations and calls the last completed invariant pass judged (the first pass: the "
        "whole window; later ones: what was touched since the previous one).",
        labels=["subject"],
    )
    errors = CounterMetricFamily(
        "toolfence_exporter_invariant_pass_errors",
        "Invariant passes that failed (the next one reads from where the last completed one did).",
    )
    if passes is not None:
        age.add_metric([], passes.age_seconds)
        errors.add_metric([], passes.errors)
        if passes.last is not None:
            duration.add_metric([], passes.last.duration)
            judged.add_metric(["operations"], passes.last.result.operations)
            judged.add_metric(["calls"], passes.last.result.calls)
    yield from (age, duration, judged, errors)


class MultiprocessTreeCollector(Collector):
    """Sums multiprocess files of a directory and of its immediate subdirectories.

    A flat directory is prometheus-client's usual layout (one host, one fleet);
    one subdirectory per container is how containers share a volume without
    their PIDs colliding (see docker-compose.yml). Counters and histograms are
    summed across all files; live gauges (none defined yet) would be keyed by pid
    and are not meaningful across subdirectories.
    """

    def __init__(self, root: str) -> None:
        self._root = root

    def collect(self) -> Iterable[Metric]:
        files = sorted(
            path
            for path in glob.glob(os.path.join(glob.escape(self._root), "*.db"))
            + glob.glob(os.path.join(glob.escape(self._root), "*", "*.db"))
            if _holds_values(path)
        )
        merged = prometheus_multiprocess.MultiProcessCollector.merge(  # type: ignore[no-untyped-call]
            files, accumulate=True
        )
        return list(merged)


def _holds_values(path: str) -> bool:
    """False for a file a process has created but not yet sized (prometheus-client
    opens it, then truncates it to its first page): it holds no values yet, and
    reading it would fail the whole scrape with a struct error."""
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


class _ProcessRegistryCollector(Collector):
    """The default registry (this process's own metrics), when not in multiprocess mode."""

    def collect(self) -> Iterable[Metric]:
        return list(REGISTRY.collect())


def build_registry(settings: Settings, database: DatabaseCollector) -> CollectorRegistry:
    """The registry `/metrics` serves: process metrics plus the database gauges."""
    registry = CollectorRegistry(auto_describe=False)
    metrics_dir = settings.metrics_dir or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if metrics_dir:
        if not os.path.isdir(metrics_dir):
            log.warning("PROMETHEUS_MULTIPROC_DIR %s does not exist yet", metrics_dir)
        registry.register(MultiprocessTreeCollector(metrics_dir))
    else:
        registry.register(_ProcessRegistryCollector())
    registry.register(database)
    return registry


# ------------------------------------------------------------------- serving


@dataclass
class RunningExporter:
    server: WSGIServer
    thread: threading.Thread
    registry: CollectorRegistry
    database: DatabaseCollector

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
        self.database.close()


def start(
    settings: Settings, port: int, host: str = LOOPBACK, config: ExporterConfig | None = None
) -> RunningExporter:
    """Serve /metrics on a daemon thread and return at once (port 0 picks a free one)."""
    database = DatabaseCollector(settings.database_url, config or ExporterConfig.from_env())
    registry = build_registry(settings, database)
    server, thread = start_http_server(port, addr=host, registry=registry)
    database.start_passes()
    return RunningExporter(server, thread, registry, database)


def serve(
    settings: Settings, port: int, host: str = LOOPBACK, config: ExporterConfig | None = None
) -> None:
    """Serve /metrics until SIGTERM or Ctrl-C (`toolfence metrics --port N`)."""
    running = start(settings, port, host, config)
    log.info("serving metrics on http://%s:%d/metrics", host, running.port)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    try:
        # A timed wait keeps the main thread responsive to signals.
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()


# ------------------------------------------------------------------- multiprocess files


def prepare_multiprocess_dir(path: str | os.PathLike[str]) -> Path:
    """Create the multiprocess directory and delete stale metric files in it.

    Call once when the whole fleet starts, before any process writes metrics:
    files left by an earlier fleet would otherwise be summed forever, and a
    file deleted under a live process loses that process's counts. Deletes only
    `*.db` files (directly and in per-container subdirectories).
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    for stale in [*root.glob("*.db"), *root.glob("*/*.db")]:
        stale.unlink(missing_ok=True)
    return root


def mark_process_dead(pid: int, path: str | None = None) -> None:
    """Tell the multiprocess files that `pid` has exited.

    Wire it where a child process exits, e.g. Celery's
    `worker_process_shutdown` signal (`mark_process_dead(pid)` with the pid it
    passes) or gunicorn's `child_exit` hook. It removes the dead process's live
    gauge files so `livesum`/`liveall` gauges stop counting it; counters and
    histograms keep its counts, as they must. A no-op outside multiprocess mode.
    """
    path = path or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return
    prometheus_multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
