"""A pipeline of statements on libpq's own pipeline, with statements prepared once per
connection (PostgreSQL).

`enqueue`'s reads and writes are one pipeline each (decision 0212). Through
psycopg's `Connection.pipeline()` a statement costs 60-100 µs of the client's CPU
whatever it does: a cursor, a query conversion, a generator per send and per
fetch, a poll per statement. Measured on `enqueue`'s own seven statements,
replayed (one-call request, BEGIN and COMMIT included): 530-680 µs of CPU through
psycopg's pipeline, 280-320 µs here; with the statements unnamed instead of
prepared the server parses and plans each one every time and the wall time goes
from 0.9 to 1.4 ms, so they are prepared
(docs/decisions/0235-admission-s-pipelines-drive-libpq-directly.md).

What is psycopg's stays psycopg's: the values are adapted by a `Transformer` of the
connection (the same dumpers and loaders, the same formats and type oids an
`execute` would send), an error is psycopg's exception for its SQLSTATE, the
transaction is started with the connection's own isolation, read-only and
deferrable settings as psycopg would start it, and the connection's lock is held.

A prepared statement is named per connection and per (SQL, parameter types): a
parameter's type fixes how the server reads its bytes, so a statement prepared for
one set of types is never executed with another (psycopg keys its own cache the
same way). Names are never reused on a connection. psycopg deallocates every
prepared statement of the session when it rolls back a transaction in which it
had prepared its own (`DEALLOCATE ALL`); its manager's `clear` is wrapped so that
this connection's names are forgotten exactly then. A statement dropped some other
way (`DISCARD ALL` run by hand) fails once with SQLSTATE 26000; the names are then
forgotten and the caller's transaction fails as on any statement error.

A fault in the middle of the exchange (an exception that is not a statement's
error: a lost connection, an interrupt) leaves the connection in an unknown
state: it is closed, `PipelineBroken` carries the driver's error for it (an
interrupt is re-raised as itself) and the caller invalidates it, as on a
disconnect.
"""

from __future__ import annotations

import re
import select
from collections.abc import Sequence
from typing import Any, cast

import psycopg
from psycopg import errors as pg_errors
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq import ExecStatus, PipelineStatus, TransactionStatus

from executor.errors import StoreError
from executor.store.results import DriverResult, DriverRow

# Prepared statements kept per connection at most; past it a statement runs unnamed
# (parsed and planned every time, correct, slower) rather than growing the
# session's memory without bound.
MAX_PREPARED = 256

_PLACEHOLDER = re.compile(r"%\(([^)]+)\)s|%%")


class PipelineBroken(StoreError):
    """The exchange stopped half-way and the connection was closed: `error` is the
    driver's error for it (a lost connection's own, or an `OperationalError` naming
    what else stopped it), as a disconnect would raise."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.error = error


class StatementFailed(StoreError):
    """A statement failed: psycopg's `error` for it, and its `index` among the
    statements given (the pipeline has ended; the transaction is aborted)."""

    def __init__(self, index: int, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error


class _Prepared:
    """One connection's prepared statements: (SQL, parameter types) → name."""

    __slots__ = ("names", "counter")

    def __init__(self) -> None:
        self.names: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self.counter = 0

    def forget(self) -> None:
        self.names.clear()

    def name_for(self, key: tuple[bytes, tuple[int, ...]]) -> tuple[bytes | None, bool]:
        """(name, must it be prepared now); name None: run it unnamed."""
        name = self.names.get(key)
        if name is not None:
            return name, False
        if len(self.names) >= MAX_PREPARED:
            return None, False
        self.counter += 1
        name = f"toolfence_{self.counter}".encode()
        self.names[key] = name
        return name, True


_CONVERTED: dict[str, tuple[bytes, tuple[str, ...]]] = {}
_COLUMNS: dict[bytes, list[str]] = {}  # a statement's result columns, by its SQL


def supported(driver: psycopg.Connection[Any]) -> bool:
    """Can this connection take the direct path? (Not inside psycopg's own pipeline,
    and psycopg's prepared-statement manager is the one this module knows.)"""
    if driver.pgconn.pipeline_status != PipelineStatus.OFF:
        return False
    manager = getattr(driver, "_prepared", None)
    return manager is not None and callable(getattr(manager, "clear", None))


def _prepared_of(driver: psycopg.Connection[Any]) -> _Prepared:
    """The connection's prepared statements, kept on psycopg's own manager of them,
    whose `clear` is wrapped once so that ours are forgotten when it deallocates."""
    manager = driver._prepared  # noqa: SLF001 - see the module's docstring
    state = getattr(manager, "toolfence_prepared", None)
    if state is None:
        state = _Prepared()
        original = manager.clear

        def clear() -> bool:
            deallocating = bool(original())
            if deallocating:  # psycopg will send DEALLOCATE ALL: ours go with it
                state.forget()
            return deallocating

        manager.clear = clear  # type: ignore[method-assign]
        manager.toolfence_prepared = state  # type: ignore[attr-defined]
    return cast(_Prepared, state)


def convert(sql: str) -> tuple[bytes, tuple[str, ...]]:
    """`%(name)s` placeholders to `$n` (a name used twice is one parameter) and
    `%%` to `%`: the query as the server takes it and the names in order."""
    found = _CONVERTED.get(sql)
    if found is not None:
        return found
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    found = _CONVERTED[sql] = (_PLACEHOLDER.sub(number, sql).encode(), tuple(names))
    return found


def _begin_command(driver: psycopg.Connection[Any]) -> bytes:
    """The BEGIN psycopg would send for this connection's settings."""
    parts = [b"BEGIN"]
    if driver.isolation_level is not None:
        level = psycopg.IsolationLevel(driver.isolation_level).name.replace("_", " ")
        parts += [b"ISOLATION LEVEL", level.encode()]
    if driver.read_only is not None:
        parts.append(b"READ ONLY" if driver.read_only else b"READ WRITE")
    if driver.deferrable is not None:
        parts.append(b"DEFERRABLE" if driver.deferrable else b"NOT DEFERRABLE")
    return b" ".join(parts)


def run(
    driver: psycopg.Connection[Any], statements: Sequence[tuple[str, dict[str, Any]]]
) -> list[DriverResult]:
    """Run `statements` (SQL with `%(name)s` placeholders, and values) in order, in the
    connection's transaction (started as psycopg would start it if none is open), as
    one pipeline ended by one Sync: one round trip. A statement's error is raised as
    `StatementFailed` once the pipeline has ended (the statements after it were skipped, the
    transaction is aborted). A value psycopg cannot adapt is refused
    before anything is sent. Any other fault half-way closes the connection and
    raises `PipelineBroken` from it (an interrupt is re-raised as itself)."""
    with driver.lock:
        if driver.closed:
            raise psycopg.OperationalError("the connection is closed")
        pgconn = driver.pgconn
        prepared = _prepared_of(driver) if driver.prepare_threshold is not None else None
        tx = Transformer(driver)
        commands = []
        for sql, values in statements:
            query, names = convert(sql)
            params = tx.dump_sequence([values[name] for name in names], [PyFormat.AUTO] * len(names))
            commands.append((query, params, tuple(tx.types or ()), tuple(tx.formats or ())))
        begin = not driver.autocommit and pgconn.transaction_status == TransactionStatus.IDLE
        new_keys: list[tuple[bytes, tuple[int, ...]]] = []
        try:
            pgconn.enter_pipeline_mode()
            sent: list[bytes | None] = []  # per command: a caller's statement's SQL, else None
            if begin:
                pgconn.send_query_params(_begin_command(driver), None)
                sent.append(None)
            for query, params, types, formats in commands:
                name, prepare = prepared.name_for((query, types)) if prepared is not None else (None, False)
                if name is None:
                    pgconn.send_query_params(query, params, types, formats)
                else:
                    if prepare:
                        new_keys.append((query, types))
                        pgconn.send_prepare(name, query, types)
                        sent.append(None)
                    pgconn.send_query_prepared(name, params, formats)
                sent.append(query)
            pgconn.pipeline_sync()
            results, error, index = _exchange(pgconn, sent, tx, driver.info.encoding)
            pgconn.exit_pipeline_mode()
        except BaseException as exc:
            pgconn.finish()  # its state is unknown: nobody may use it again
            if prepared is not None:
                prepared.forget()
            if not isinstance(exc, Exception):
                raise
            error = exc if isinstance(exc, psycopg.Error) else psycopg.OperationalError(
                f"the pipeline stopped half-way and its connection was closed: {exc!r}"
            )
            raise PipelineBroken(error) from exc
        if error is not None:
            if prepared is not None:
                if error.sqlstate == "26000":
                    prepared.forget()  # dropped behind our back: prepare afresh next time
                for key in new_keys:  # a Parse after the error was skipped
                    prepared.names.pop(key, None)
            raise StatementFailed(index, error)
        return results


def _wait(fd: int, events: int) -> None:
    poller = select.poll()
    poller.register(fd, events)
    poller.poll()


def _rows(tx: Any, result: Any, query: bytes) -> list[DriverRow]:
    """A result's rows, each value loaded by psycopg's loader for its column's type."""
    names = _COLUMNS.get(query)
    if names is None or len(names) != result.nfields:  # a statement's columns are its SQL's
        names = _COLUMNS[query] = [result.fname(i).decode() for i in range(result.nfields)]
    tx.set_pgresult(result)
    return cast(list[DriverRow], tx.load_rows(
        0, result.ntuples, lambda values: DriverRow(dict(zip(names, values, strict=True)))
    ))


def _exchange(
    pgconn: Any, sent: list[bytes | None], tx: Any, encoding: str
) -> tuple[list[DriverResult], psycopg.Error | None, int]:
    """Send what is queued and read every result up to the Sync: the caller's
    statements' results, the first error and the index of the statement it failed
    (or of the BEGIN or Parse before it)."""
    fd = pgconn.socket
    while pgconn.flush() == 1:  # the rest did not fit the socket yet
        _wait(fd, select.POLLIN | select.POLLOUT)
        pgconn.consume_input()  # results read meanwhile keep the server from blocking
    results: list[DriverResult] = []
    error: psycopg.Error | None = None
    position = failed = 0
    while True:
        while pgconn.is_busy():
            _wait(fd, select.POLLIN)
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:  # the end of one command's results
            continue
        status = result.status
        if status == ExecStatus.PIPELINE_SYNC:
            return results, error, failed
        mine = sent[position]
        position += 1
        if status == ExecStatus.FATAL_ERROR:
            if error is None:
                error = pg_errors.error_from_result(result, encoding=encoding)
                before = sum(1 for command in sent[:position] if command is not None)
                failed = max(before - (1 if mine is not None else 0), 0)
        elif status == ExecStatus.PIPELINE_ABORTED or mine is None:
            pass
        elif status == ExecStatus.TUPLES_OK:
            results.append(DriverResult(_rows(tx, result, mine), result.ntuples))
        else:
            changed = result.command_tuples
            results.append(DriverResult([], -1 if changed is None else changed))

