"""Engines: URL normalisation, per-dialect connection setup, the process-wide pool.

SQLite gets WAL, a busy timeout and `BEGIN IMMEDIATE` for writers; a read-only
view of an engine (`read_only`) takes no write lock. Nothing here knows a table.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, Table, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DisconnectionError

from executor import settings
from executor.errors import ConfigurationError


class DatabaseSettingError(ConfigurationError, ValueError):
    """A database setting the engine cannot use (its URL, `TOOLFENCE_DB_*`)."""


class DatabaseUrlError(DatabaseSettingError):
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


def single_statement(engine: Engine) -> Engine:
    """The same engine (and pool) for a unit of work that is exactly one statement.

    On PostgreSQL its connections are in autocommit: one statement is its own
    transaction (atomic, and committed as durably as any other: synchronous_commit
    is unchanged), so it costs one round trip instead of BEGIN, the statement and
    COMMIT. SQLite gets the engine itself (`BEGIN IMMEDIATE` as everywhere). Never
    for two statements that must commit together: each would commit on its own.
    """
    if engine.dialect.name != "postgresql":
        return engine
    return engine.execution_options(isolation_level="AUTOCOMMIT")


def make_engine(url: str, **kwargs: Any) -> Engine:
    """A new engine. SQLite gets WAL, a busy timeout and `BEGIN IMMEDIATE`.

    `BEGIN IMMEDIATE` takes the write lock at the start of every transaction, so
    two processes never both read-then-upgrade and deadlock (SQLite would answer
    one of them SQLITE_BUSY at once, without waiting).
    """
    url = normalize_url(url)
    # A statement's parameters are arguments and server contexts: never in an
    # error's message (executor/store/errors.py).
    kwargs.setdefault("hide_parameters", True)
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
    # TOOLFENCE_DB_POOL_SIZE, or what `toolfence worker --pool threads` made this
    # process's settings (its concurrency): connections are held per statement, never
    # across a downstream call, so the pool need not exceed the threads.
    kwargs.setdefault("pool_size", settings.current().db_pool_size)
    kwargs.setdefault("max_overflow", 10)
    idle_seconds = ping_idle_seconds()
    if "pool_pre_ping" in kwargs or idle_seconds <= 0:
        kwargs.setdefault("pool_pre_ping", True)
        return create_engine(url, **kwargs)
    engine = create_engine(url, **kwargs)
    _ping_when_idle(engine, idle_seconds)
    return engine


PING_IDLE_ENV = "TOOLFENCE_DB_PING_IDLE_SECONDS"
_CHECKED_IN_AT = "toolfence_checked_in_at"


def ping_idle_seconds() -> float:
    """How long a pooled PostgreSQL connection may sit unused before its next checkout
    pings it (`TOOLFENCE_DB_PING_IDLE_SECONDS`, default 1; 0 pings at every checkout,
    SQLAlchemy's `pool_pre_ping`)."""
    try:
        return float(settings.read(PING_IDLE_ENV))
    except settings.SettingsError as exc:
        raise DatabaseSettingError(str(exc)) from None


def _ping_when_idle(engine: Engine, idle_seconds: float) -> None:
    """`pool_pre_ping`, only for connections that sat in the pool `idle_seconds` or more.

    A ping is a round trip (0.5 ms wall, 0.3 ms of the client's CPU here) at every
    checkout, and a worker checks out twice per operation. A connection that was
    in use less than a second ago is alive unless its session was killed in that
    second; then its next statement fails instead of the ping, SQLAlchemy
    invalidates the pool (a disconnect error), and the caller's own handling of
    a lost connection applies (docs/decisions/0176-ping-only-idle-connections.md).
    A connection that sat longer (a quiet night, a database restarted meanwhile)
    is pinged, and a dead one is replaced before anyone uses it, as before.
    """

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection: Any, record: Any) -> None:
        if dbapi_connection is not None:
            record.info[_CHECKED_IN_AT] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        checked_in_at = record.info.get(_CHECKED_IN_AT)
        # A connection never checked in was opened for this checkout: it is alive.
        if checked_in_at is None or time.monotonic() - checked_in_at < idle_seconds:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # The pool discards this connection and checks out another (a new one).
            raise DisconnectionError() from exc


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
