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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError, OperationalError

from executor.store.records import StoreError


class StoreDatabaseError(StoreError):
    """A database error at the store boundary. `sqlstate` (PostgreSQL's code, None on
    SQLite), `kind` (the driver's exception class), `connection_error` (the database
    was unreachable or the connection died: trying again may help)."""

    def __init__(self, *, sqlstate: str | None, kind: str, connection_error: bool) -> None:
        where = f"SQLSTATE {sqlstate}, " if sqlstate else ""
        super().__init__(f"the database refused the statement ({where}{kind})")
        self.sqlstate = sqlstate
        self.kind = kind
        self.connection_error = connection_error

    @classmethod
    def from_dbapi(cls, exc: DBAPIError) -> StoreDatabaseError:
        orig = exc.orig
        sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
        return cls(
            sqlstate=sqlstate if isinstance(sqlstate, str) else None,
            kind=type(orig).__name__ if orig is not None else type(exc).__name__,
            connection_error=isinstance(exc, OperationalError) or bool(exc.connection_invalidated),
        )


CONNECTION_ERRORS: tuple[type[BaseException], ...] = (DBAPIError, ConnectionError, OSError)
"""What a tool's code raises when it loses its connection to what it reads or writes
(its driver's error included). Not an answer: the worker gives the operation back
to `retry_wait` (a read's handler, a rule or check before the handler ran), and
`enqueue` raises `AdmissionUnavailable` instead of refusing the call."""


@contextmanager
def store_errors() -> Iterator[None]:
    """Re-raise any `DBAPIError` inside as a `StoreDatabaseError` (not chained: the original's
    message and parameters must not reach a traceback a log would print)."""
    try:
        yield
    except DBAPIError as exc:
        raise StoreDatabaseError.from_dbapi(exc) from None


__all__ = ["CONNECTION_ERRORS", "StoreDatabaseError", "store_errors"]
