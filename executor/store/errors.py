"""The store's one error type: a database error as the caller may see and log it.

SQLAlchemy's `DBAPIError` renders the statement's parameters into its message
(`[parameters: (...)]`), and a driver's own message can quote the row
(PostgreSQL's `DETAIL: Failing row contains (...)`); an operation's parameters
are its arguments and its server context. toolfence's engines hide parameters
(`hide_parameters=True`), but `enqueue` writes through the caller's connection,
whose engine may not. So the store boundary (`enqueue`, `results` and the other
producer reads) re-raises every database error as a `StoreDatabaseError` (a
`StoreError`) carrying the
SQLSTATE and the error's class, never its text, and not chained to it.

What an error says about trying again is `database_fault`'s, by SQLSTATE class
(decision 0193): a lost connection is `transient`, a value the database refused
(a NUL character in text, a constraint) is `bad_data`, an answer about the call.
Every place that catches a hook's or a tool's database errors reads them through
it, and so does the store boundary's `StoreDatabaseError`. (The worker's own
bookkeeping statements retry any database error a few times before they give up,
then read back what happened.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError

from executor.core.admission import REFUSED_BY_DATABASE, Refusal
from executor.core.types import ErrorCode
from executor.store.records import StoreError


class DatabaseFault(StrEnum):
    """What a database error says about trying again (docs/design.md §Admission,
    docs/errors.md; decision 0193).

    - `transient`: the connection was lost or the database could not serve the
      statement just now (SQLSTATE class 08 connection exception, 40 transaction
      rollback, 53 insufficient resources, 57 operator intervention, 58 system
      error, 55P03 lock not available; a driver's connection-level error with no
      SQLSTATE: psycopg's `OperationalError` for a refused or dropped connection,
      SQLite's busy, locked, I/O, can't-open, full or out-of-memory; an invalidated
      connection). Trying again may help.
    - `bad_data`: the database refused a value the statement carried (class 22 data
      exception, 23 integrity constraint violation, 54 program limit exceeded; a
      driver's `DataError` or `IntegrityError` with no SQLSTATE, as psycopg's for a
      NUL character in text, SQLite's constraint and too-big errors). The same
      statement is refused again, and it changed nothing: the database rolled it
      back.
    - `other`: anything else the database said (a missing table, a syntax error, an
      internal error). An operator can fix it (migrate, deploy); nothing is
      answered for good meanwhile, so a hook's or a tool's is handled as
      `transient` (`AdmissionUnavailable`, `retry_wait`). At the store boundary it
      is no `connection_error` (`StoreDatabaseError`): trying the same statement
      again does not help until someone acts, and `serve` answers 500.
    """

    TRANSIENT = "transient"
    BAD_DATA = "bad_data"
    OTHER = "other"


_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_TRANSIENT_CODES = frozenset({"55P03"})
_BAD_DATA_CLASSES = frozenset({"22", "23", "54"})
# sqlite3's `sqlite_errorname` (Python 3.11+) of an error that passes: the database
# file was busy, locked, unreadable, full, or the process short of memory.
_SQLITE_TRANSIENT = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_CANTOPEN",
                     "SQLITE_PROTOCOL", "SQLITE_NOMEM", "SQLITE_FULL", "SQLITE_INTERRUPT")


def _sqlstate(orig: object) -> str | None:
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return code if isinstance(code, str) and len(code) == 5 else None


def database_fault(exc: BaseException) -> DatabaseFault | None:
    """Classify an exception a hook, a tool or the store caught: None when it is no
    database or connection error (the caller's other rules apply)."""
    if not isinstance(exc, DBAPIError):
        # A downstream's socket or connection error (a tool's HTTP client, a driver
        # used directly): what `CONNECTION_ERRORS` always meant.
        return DatabaseFault.TRANSIENT if isinstance(exc, ConnectionError | OSError) else None
    if exc.connection_invalidated:
        return DatabaseFault.TRANSIENT
    orig = exc.orig
    sqlstate = _sqlstate(orig)
    if sqlstate is not None:
        if sqlstate[:2] in _BAD_DATA_CLASSES:
            return DatabaseFault.BAD_DATA
        if sqlstate[:2] in _TRANSIENT_CLASSES or sqlstate in _TRANSIENT_CODES:
            return DatabaseFault.TRANSIENT
        return DatabaseFault.OTHER
    sqlite_name = getattr(orig, "sqlite_errorname", None)
    if isinstance(sqlite_name, str):
        if sqlite_name.startswith(_SQLITE_TRANSIENT):
            return DatabaseFault.TRANSIENT
        if isinstance(exc, DataError | IntegrityError):
            return DatabaseFault.BAD_DATA
        return DatabaseFault.OTHER
    if isinstance(exc, DataError | IntegrityError):
        return DatabaseFault.BAD_DATA
    if isinstance(exc, OperationalError):
        return DatabaseFault.TRANSIENT  # the driver's own: no server answered
    return DatabaseFault.OTHER


def refused_for_bad_data(exc: BaseException) -> bool:
    """The database refused a value of the statement (`DatabaseFault.BAD_DATA`)."""
    return database_fault(exc) is DatabaseFault.BAD_DATA


def bad_data_refusal(exc: BaseException) -> Refusal | None:
    """The refusal a hook's bad-data database error stands for (`invalid_arguments`,
    detail `refused_by_database`); None for any other exception. For `admit`'s
    `refusal_for` and the worker's re-checks."""
    if not refused_for_bad_data(exc):
        return None
    return Refusal(
        ErrorCode.INVALID_ARGUMENTS, "the database refused a value of this call",
        (REFUSED_BY_DATABASE,),
    )


class StoreDatabaseError(StoreError):
    """A database error at the store boundary. `sqlstate` (PostgreSQL's code, None on
    SQLite), `kind` (the driver's exception class), `connection_error` (the database
    was unreachable, the connection died or the database could not serve the
    statement just now: `DatabaseFault.TRANSIENT`, trying again may help)."""

    def __init__(self, *, sqlstate: str | None, kind: str, connection_error: bool) -> None:
        where = f"SQLSTATE {sqlstate}, " if sqlstate else ""
        super().__init__(f"the database refused the statement ({where}{kind})")
        self.sqlstate = sqlstate
        self.kind = kind
        self.connection_error = connection_error

    @classmethod
    def from_dbapi(cls, exc: DBAPIError) -> StoreDatabaseError:
        orig = exc.orig
        return cls(
            sqlstate=_sqlstate(orig),
            kind=type(orig).__name__ if orig is not None else type(exc).__name__,
            connection_error=database_fault(exc) is DatabaseFault.TRANSIENT,
        )


CONNECTION_ERRORS: tuple[type[BaseException], ...] = (DBAPIError, ConnectionError, OSError)
"""The exceptions of a tool's code (a hook, a handler) that the caller classifies
itself with `database_fault` rather than as the hook's failure. A `transient` (or
`other`) one is not an answer: the worker gives the operation back to
`retry_wait` (a read's handler, a rule or check before the handler ran), and
`enqueue` raises `AdmissionUnavailable` instead of refusing the call. A `bad_data`
one is: the call alone is refused `invalid_arguments` (`refused_by_database`), at
admission or at execution, and a read that hit it ends `failed_terminal`."""


@contextmanager
def store_errors() -> Iterator[None]:
    """Re-raise any `DBAPIError` inside as a `StoreDatabaseError` (not chained: the original's
    message and parameters must not reach a traceback a log would print)."""
    try:
        yield
    except DBAPIError as exc:
        raise StoreDatabaseError.from_dbapi(exc) from None


__all__ = [
    "CONNECTION_ERRORS",
    "REFUSED_BY_DATABASE",
    "DatabaseFault",
    "StoreDatabaseError",
    "bad_data_refusal",
    "database_fault",
    "refused_for_bad_data",
    "store_errors",
]
