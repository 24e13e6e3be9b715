"""Tables (SQLAlchemy Core), engines and the database clock.

Timestamps are epoch seconds in double precision, read from the *database's*
clock (`db_now()`), never the worker's: two workers with skewed clocks must
agree on whether a lease has expired. The same code runs on PostgreSQL and
SQLite; the schema itself is created by the alembic migration in
`executor/migrations` (this module only describes it for queries).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

metadata = MetaData()

Id = BigInteger().with_variant(Integer, "sqlite")

ACTIVE_STATES = ("pending_approval", "queued", "started", "retry_wait", "reconciliation_pending")
TERMINAL_STATES = ("succeeded", "failed_terminal")

operations = Table(
    "toolfence_operations",
    metadata,
    Column("operation_id", String(200), primary_key=True),
    Column("request_id", String(200), nullable=False),
    Column("call_id", String(200), nullable=False),
    Column("position", Integer, nullable=False),
    Column("tool_name", String(200), nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("mode", String(8), nullable=False),
    Column("state", String(32), nullable=False),
    Column("generation", Integer, nullable=False, server_default="0"),
    Column("owner_token", String(64)),
    Column("lease_expires_at", Float),
    Column("intent_hash", String(64), nullable=False),
    Column("arguments", Text, nullable=False),
    Column("context", Text, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("available_at", Float, nullable=False),
    Column("queued_at", Float),
    Column("result", Text),
    Column("receipt", String(200)),
    Column("error_code", String(64)),
    Column("error", Text),
    Column("impact", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
)

# The reconciler's query for stale `started` operations and the gauges read only
# the small active part of the table through these partial indexes.
Index(
    "ix_toolfence_operations_stale_started",
    operations.c.lease_expires_at,
    postgresql_where=operations.c.state == "started",
    sqlite_where=operations.c.state == "started",
)
Index(
    "ix_toolfence_operations_queued",
    operations.c.queued_at,
    postgresql_where=operations.c.state == "queued",
    sqlite_where=operations.c.state == "queued",
)
Index(
    "ix_toolfence_operations_retry_wait",
    operations.c.available_at,
    postgresql_where=operations.c.state == "retry_wait",
    sqlite_where=operations.c.state == "retry_wait",
)
Index(
    "ix_toolfence_operations_active",
    operations.c.state,
    operations.c.updated_at,
    postgresql_where=operations.c.state.in_(ACTIVE_STATES),
    sqlite_where=operations.c.state.in_(ACTIVE_STATES),
)
Index("ix_toolfence_operations_request", operations.c.request_id, operations.c.position)

calls = Table(
    "toolfence_calls",
    metadata,
    Column("request_id", String(200), primary_key=True),
    Column("call_id", String(200), primary_key=True),
    Column("position", Integer, nullable=False),
    Column("tool_name", String(200), nullable=False),
    Column("operation_id", String(200)),
    Column("gate", String(32)),
    Column("result", Text),
    Column("created_at", Float, nullable=False),
)
Index("ix_toolfence_calls_operation", calls.c.operation_id)
# The exporter checks I6 only on calls admitted within a recent window (migration
# 0002): a range scan on this index, so its cost follows throughput, not history.
Index("ix_toolfence_calls_created", calls.c.created_at)

outbox = Table(
    "toolfence_outbox",
    metadata,
    Column("outbox_id", Id, primary_key=True, autoincrement=True),
    Column("operation_id", String(200), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("published_at", Float),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", Float, nullable=False),
    Column("last_error", Text),
)
Index(
    "ix_toolfence_outbox_unpublished",
    outbox.c.next_attempt_at,
    outbox.c.outbox_id,
    postgresql_where=outbox.c.published_at.is_(None),
    sqlite_where=outbox.c.published_at.is_(None),
)

audit_events = Table(
    "toolfence_audit_events",
    metadata,
    Column("event_id", Id, primary_key=True, autoincrement=True),
    Column("operation_id", String(200), nullable=False),
    Column("call_id", String(200)),
    Column("tool_name", String(200)),
    Column("schema_version", Integer),
    Column("from_state", String(32)),
    Column("to_state", String(32), nullable=False),
    Column("decision_code", String(64), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("intent_hash", String(64)),
    Column("actor", String(200)),
    Column("at", Float, nullable=False),
    Column("duration_ms", Float),
)
Index("ix_toolfence_audit_operation", audit_events.c.operation_id, audit_events.c.event_id)

receipts = Table(
    "toolfence_receipts",
    metadata,
    Column("receipt_row_id", Id, primary_key=True, autoincrement=True),
    Column("operation_id", String(200), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("receipt", String(200), nullable=False),
    Column("accepted", Boolean, nullable=False),
    Column("source", String(32), nullable=False),
    Column("recorded_at", Float, nullable=False),
)
Index("ix_toolfence_receipts_operation", receipts.c.operation_id)
# The exporter's I1 check starts from accepted receipts recorded within a recent
# window (migration 0002); the predicate is spelt per dialect because SQLite only
# uses a partial index whose WHERE term matches the query's text (`accepted = 1`).
Index(
    "ix_toolfence_receipts_accepted_recorded",
    receipts.c.recorded_at,
    receipts.c.operation_id,
    postgresql_where=receipts.c.accepted,
    sqlite_where=receipts.c.accepted == 1,
)

approvals = Table(
    "toolfence_approvals",
    metadata,
    Column("approval_id", String(64), primary_key=True),
    Column("operation_id", String(200), nullable=False, unique=True),
    Column("intent_hash", String(64), nullable=False),
    Column("impact", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("requested_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("decided_at", Float),
    Column("decided_by", String(200)),
    Column("reason", Text),
)
Index(
    "ix_toolfence_approvals_pending",
    approvals.c.requested_at,
    postgresql_where=approvals.c.state == "pending",
    sqlite_where=approvals.c.state == "pending",
)


class db_now(FunctionElement[float]):  # noqa: N801 - reads like the SQL function it is
    """The database clock, as epoch seconds."""

    type = Float()
    inherit_cache = True


@compiles(db_now, "postgresql")
def _db_now_postgresql(element: Any, compiler: Any, **kw: Any) -> str:
    # clock_timestamp(), not now(): now() is frozen at transaction start.
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


class DatabaseUrlError(ValueError):
    pass


def normalize_url(url: str) -> str:
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if not (url.startswith("postgresql+psycopg://") or url.startswith("sqlite")):
        raise DatabaseUrlError(
            f"unsupported database URL scheme in {url.split('://')[0]!r}: "
            "use postgresql+psycopg://… or sqlite:///path"
        )
    return url


_engines: dict[str, Engine] = {}
READ_ONLY_OPTION = "toolfence_read_only"


def read_only(engine: Engine) -> Engine:
    """The same engine (and pool) for pure reads: on SQLite they take no write lock.

    Use it for reads that may run while the same process holds a write
    transaction (an access hook reading during `enqueue`), and for read-only
    paths such as results and the exporter.
    """
    return engine.execution_options(**{READ_ONLY_OPTION: True})


def make_engine(url: str, **kwargs: Any) -> Engine:
    """A new engine. SQLite gets WAL, a busy timeout and `BEGIN IMMEDIATE`.

    `BEGIN IMMEDIATE` takes the write lock at the start of every transaction, so
    two processes never both read-then-upgrade and deadlock (SQLite would answer
    one of them SQLITE_BUSY at once, without waiting).
    """
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"timeout": 60, "check_same_thread": False}, **kwargs
        )

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=60000")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            if conn.get_execution_options().get(READ_ONLY_OPTION):
                conn.exec_driver_sql("BEGIN")  # a pure read: share the file with writers
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 5)
    kwargs.setdefault("max_overflow", 10)
    return create_engine(url, **kwargs)


def get_engine(url: str) -> Engine:
    """A process-wide engine per URL (workers fork: call `dispose_engines` in the child)."""
    engine = _engines.get(url)
    if engine is None:
        engine = _engines[url] = make_engine(url)
    return engine


def dispose_engines() -> None:
    for engine in _engines.values():
        engine.dispose(close=False)
    _engines.clear()


def ping(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def insert_ignore(conn: Connection, table: Table, values: dict[str, Any], key: Sequence[str]) -> bool:
    """INSERT … ON CONFLICT DO NOTHING on either dialect; True when a row was inserted."""
    ins: Any
    if conn.dialect.name == "postgresql":
        ins = postgresql.insert(table).values(**values).on_conflict_do_nothing(index_elements=key)
    else:
        ins = sqlite.insert(table).values(**values).on_conflict_do_nothing(index_elements=key)
    # RETURNING rather than rowcount: drivers disagree on rowcount for DO NOTHING.
    return conn.execute(ins.returning(table.c[key[0]])).first() is not None
