"""The hot statements of the worker and the relay, run on the driver's connection
(PostgreSQL).

A worker's path per operation is two statements built once by the store (the
reservation and the completion, `operations.py`). Through SQLAlchemy's
`Connection` each costs 150-250 µs of the worker's CPU around psycopg's own
work: an execution context, result metadata and `Row` objects, the
transaction's bookkeeping and, for the autocommit reservation, an isolation
level set on checkout and reset on checkin. Measured in one process on the
same statement: 240 µs (a transaction) and 180 µs (autocommit) through
`Connection`, 75 µs on the pooled driver connection
(docs/decisions/0177-the-reservation-and-the-completion-run-on-the-driver-s.md).

So those statements run here, each as a one-statement pipeline on libpq with the
statement prepared once per connection (`wire.py`, decision 0235: about 45 µs of
the client's CPU where a psycopg cursor's `execute` took 75-85), or through a
cursor where that path steps aside: the same SQL (the statement the store built,
compiled once per statement object by SQLAlchemy's own PostgreSQL compiler),
the same pool (`engine.raw_connection()`: checkout events such as the idle
ping still fire, and the connection goes back with the pool's reset), the same
transaction semantics, and the same errors. A driver error is raised as the
`sqlalchemy.exc.DBAPIError` subclass SQLAlchemy would have raised (never with
its parameters), and a lost connection invalidates the pool exactly as
SQLAlchemy does on a disconnect, so every caller's handling of a lost
connection (owner-token recovery, `_with_ambiguity`) is unchanged.

`DriverConnection` offers the part of `Connection` the store's hot functions
use (`dialect`, `execute(statement, parameters)` and the result's
`one_or_none`, `scalar_one`, `scalars`); they accept either (`Executes`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, cast

import psycopg
from psycopg.pq import ExecStatus
from psycopg.rows import dict_row
from sqlalchemy import Engine, Executable
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from executor.store import wire
from executor.store.results import DriverResult, DriverRow


class Executes(Protocol):
    """What the store's hot functions need of a connection: SQLAlchemy's `Connection`
    or a `DriverConnection`."""

    @property
    def dialect(self) -> Dialect: ...

    def execute(self, statement: Executable, parameters: Mapping[str, Any] | None = None, /) -> Any: ...


class _Compiled:
    __slots__ = ("statement", "sql", "defaults", "required", "processors")

    def __init__(self, statement: Executable, dialect: Dialect) -> None:
        assert isinstance(statement, ClauseElement)
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        if compiled.positional:
            raise TypeError("the driver-level path takes named parameters only")
        self.statement = statement  # pins the id() the cache is keyed by
        self.sql = compiled.string
        # What SQLAlchemy would do to a value on its way in (a Boolean's strict check).
        self.processors: dict[str, Callable[[Any], Any]] = {}
        for name, process in compiled._bind_processors.items():  # noqa: SLF001 - once per statement
            if not callable(process):  # a tuple's processors, per element
                raise TypeError("the driver-level path takes no tuple parameters")
            self.processors[name] = process
        names = compiled.bind_names
        binds = compiled.binds.values()
        # The values SQLAlchemy bound when the statement was built (a literal's
        # anonymous parameter), processed once; the caller's values are the rest.
        self.defaults = {
            names[bind]: self._processed(names[bind], bind.effective_value)
            for bind in binds if not bind.required
        }
        self.required = frozenset(names[bind] for bind in binds if bind.required)

    def _processed(self, name: str, value: Any) -> Any:
        process = self.processors.get(name)
        return value if process is None else process(value)

    def parameters(self, given: Mapping[str, Any] | None) -> dict[str, Any]:
        given = given or {}
        values = {**self.defaults, **given}
        # Only the few names with a processor are processed (a given value: the
        # defaults were processed once); a loop over every value cost more.
        for name, process in self.processors.items():
            if name in given:
                values[name] = process(given[name])
        if not self.required <= values.keys():
            missing = ", ".join(sorted(self.required - values.keys()))
            raise TypeError(f"a value is required for the statement's parameter(s) {missing}")
        return values


_compiled: dict[int, _Compiled] = {}
_compiled_lock = threading.Lock()
# Statements built afresh per call (a test's ManualClock) would fill the cache.
_MAX_COMPILED = 512


def _compile(statement: Executable, dialect: Dialect) -> _Compiled:
    entry = _compiled.get(id(statement))
    if entry is not None and entry.statement is statement:
        return entry
    entry = _Compiled(statement, dialect)
    with _compiled_lock:
        if len(_compiled) >= _MAX_COMPILED:
            _compiled.clear()
        _compiled[id(statement)] = entry
    return entry


def compiled_for(statement: Executable, dialect: Dialect) -> _Compiled:
    """`statement` compiled once for the driver-level path: `.sql` and `.parameters(values)`."""
    return _compile(statement, dialect)


class DriverConnection:
    """One pooled connection, used at driver level (see the module's docstring)."""

    def __init__(self, engine: Engine, pooled: PoolProxiedConnection) -> None:
        self._engine = engine
        self._pooled = pooled
        driver = pooled.driver_connection
        assert isinstance(driver, psycopg.Connection)
        self._driver: psycopg.Connection[Any] = driver
        self.dialect = engine.dialect
        # `first_statement_alone`: after the first statement (autocommit), a transaction.
        self._then_transaction = False

    def execute(self, statement: Executable, parameters: Mapping[str, Any] | None = None, /) -> DriverResult:
        compiled = _compile(statement, self.dialect)
        values = compiled.parameters(parameters)
        if wire.supported(self._driver):
            result = self._on_wire(compiled.sql, values)
        else:
            result = self._on_cursor(compiled.sql, values)
        if self._then_transaction:
            # The first statement has committed on its own; what follows it in the
            # block is one transaction (begun at the next statement).
            self._then_transaction = False
            self._driver.autocommit = False
        return result

    def _on_wire(self, sql: str, values: dict[str, Any]) -> DriverResult:
        """On libpq's pipeline, prepared once per connection (decision 0235): about 30
        µs of the client's CPU less than a cursor's `execute` per statement."""
        try:
            return wire.run(self._driver, [(sql, values)])[0]
        except wire.StatementFailed as failed:
            raise self._wrapped(failed.error, sql) from failed.error
        except wire.PipelineBroken as broken:
            # Closed by `wire`: invalid for the pool, as on a disconnect.
            self._engine.pool._invalidate(self._pooled, broken.error)  # noqa: SLF001 - as Connection does
            raise DBAPIError.instance(
                sql, None, broken.error, psycopg.Error, hide_parameters=True,
                connection_invalidated=True, dialect=self.dialect,
            ) from broken.error
        except psycopg.Error as exc:  # a value psycopg cannot adapt: nothing was sent
            raise self._wrapped(exc, sql) from exc

    def _on_cursor(self, sql: str, values: dict[str, Any]) -> DriverResult:
        try:
            # dict_row names the columns from the result itself: `cursor.description`
            # builds a Column object per column on every access.
            with self._driver.cursor(row_factory=dict_row) as cursor:
                cursor.execute(sql, values)
                result = cursor.pgresult
                if result is None or result.status != ExecStatus.TUPLES_OK:
                    return DriverResult([], cursor.rowcount)  # a statement that returns no rows
                return DriverResult([DriverRow(row) for row in cursor.fetchall()], cursor.rowcount)
        except psycopg.Error as exc:
            raise self._wrapped(exc, sql) from exc

    def commit(self) -> None:
        try:
            self._driver.commit()
        except psycopg.Error as exc:
            raise self._wrapped(exc, "COMMIT") from exc

    def rollback(self) -> None:
        """Undo the block's statements so far; the block may go on in a new transaction
        (a refusal decided after a write, as the reference ledger's transfer has)."""
        try:
            self._driver.rollback()
        except psycopg.Error as exc:
            raise self._wrapped(exc, "ROLLBACK") from exc

    def _wrapped(self, exc: psycopg.Error, sql: str) -> BaseException:
        """What SQLAlchemy's `Connection` raises for this driver error, and what it does
        first: a disconnect invalidates this connection and the pool (connections
        older than now are replaced at their next checkout)."""
        disconnect = self.dialect.is_disconnect(cast(Any, exc), self._pooled, None)
        if disconnect:
            self._engine.pool._invalidate(self._pooled, exc)  # noqa: SLF001 - as Connection does
        return DBAPIError.instance(
            sql, None, exc, psycopg.Error, hide_parameters=True,
            connection_invalidated=disconnect, dialect=self.dialect,
        )


@contextmanager
def _checked_out(engine: Engine, *, autocommit: bool) -> Iterator[DriverConnection]:
    try:
        pooled = engine.raw_connection()
    except psycopg.Error as exc:
        # The pool's checkout hands back the driver's own error when a new connection
        # cannot be made (`Connection` wraps it): wrapped here as it would be.
        raise DBAPIError.instance(
            None, None, exc, psycopg.Error, hide_parameters=True,
            connection_invalidated=engine.dialect.is_disconnect(cast(Any, exc), None, None),
            dialect=engine.dialect,
        ) from exc
    conn = DriverConnection(engine, pooled)
    driver = conn._driver  # noqa: SLF001
    try:
        if autocommit:
            driver.autocommit = True
        yield conn
    except DBAPIError as exc:
        # A statement the database refused: roll back and return the connection, as
        # SQLAlchemy does; one that is lost, or that cannot roll back, is discarded.
        if pooled.is_valid and (exc.connection_invalidated or not _rolled_back(driver, autocommit)):
            pooled.invalidate()
        raise
    except BaseException:
        # Anything else (a time limit raised inside a wait on the socket) leaves the
        # connection's protocol state unknown: it never goes back to the pool.
        if pooled.is_valid:
            pooled.invalidate()
        raise
    else:
        if autocommit and not _rolled_back(driver, autocommit):
            # The statement committed; a connection that cannot be made transactional
            # again (it broke since) is discarded, not handed to the next caller.
            pooled.invalidate()
    finally:
        pooled.close()  # back to the pool (an invalidated one is discarded)


def _rolled_back(driver: psycopg.Connection[Any], autocommit: bool) -> bool:
    """Idle and transactional again (a rollback of an idle connection sends nothing)."""
    try:
        driver.rollback()
        if autocommit:
            driver.autocommit = False
    except psycopg.Error:
        return False
    return True


@contextmanager
def autocommit(engine: Engine) -> Iterator[DriverConnection]:
    """A pooled connection for exactly one statement, which is its own transaction (as
    `engine.single_statement`): atomic, and committed as durably as any COMMIT."""
    with _checked_out(engine, autocommit=True) as conn:
        yield conn


@contextmanager
def transaction(engine: Engine) -> Iterator[DriverConnection]:
    """A pooled connection in one transaction, committed when the block ends without an
    exception (as `engine.begin()`); on an exception nothing is committed."""
    with _checked_out(engine, autocommit=False) as conn:
        yield conn
        conn.commit()


@contextmanager
def first_statement_alone(engine: Engine) -> Iterator[DriverConnection]:
    """A pooled connection whose first statement is its own transaction (autocommit: one
    round trip, no BEGIN and COMMIT of its own) and whose later statements, if the
    block runs any, are one transaction after it, committed when the block ends
    without an exception (on an exception the later ones roll back; the first has
    committed). For a unit of work that is one statement, with follow-ups that need
    not be atomic with it: the completion and its wake-up of a request's successors
    (docs/decisions/0229)."""
    with _checked_out(engine, autocommit=True) as conn:
        conn._then_transaction = True  # noqa: SLF001 - this module's own connection
        yield conn
        if not conn._driver.autocommit:  # noqa: SLF001
            conn.commit()


def supported(engine: Engine) -> bool:
    """The driver-level path is for PostgreSQL through psycopg; SQLite keeps `Connection`."""
    return engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
