"""Where "now" comes from in the store's SQL.

Production uses the database's clock, so every worker agrees on lease expiry.
Tests inject a `ManualClock` to step time deterministically.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Connection, Float, literal, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement


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


class Clock(Protocol):
    def now(self) -> ColumnElement[float]: ...


class DatabaseClock:
    def now(self) -> ColumnElement[float]:
        return db_now()


class ManualClock:
    """A clock the test moves by hand."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._value = start
        self._lock = threading.Lock()

    @property
    def value(self) -> float:
        return self._value

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._value += seconds

    def now(self) -> ColumnElement[float]:
        return literal(self._value, Float())


DATABASE_CLOCK = DatabaseClock()


def read_now(conn: Connection, clock: Clock = DATABASE_CLOCK) -> float:
    """The clock's current value, read once: for ages computed in Python against
    times the store recorded on the same clock (a result's `observed_at`)."""
    return float(conn.execute(select(clock.now())).scalar_one())
