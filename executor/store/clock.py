"""Where "now" comes from in the store's SQL.

Production uses the database's clock, so every worker agrees on lease expiry.
Tests inject a `ManualClock` to step time deterministically.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

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

_P = ParamSpec("_P")
_T = TypeVar("_T")


def built_once(build: Callable[Concatenate[Clock, _P], _T]) -> Callable[Concatenate[Clock, _P], _T]:
    """Memoise a statement builder whose first argument is the clock.

    On the database clock `now()` is the same SQL every time, so the statement is
    built once per key and reused (a SQLAlchemy construct is immutable and safe to
    share between threads; its compiled form is then one cache hit). A
    `ManualClock` writes its current value into the SQL as a literal, so for it
    the statement is built afresh on every call, by the same builder.
    """
    memo: Callable[..., _T] = functools.cache(build)  # every argument is a hashable key

    @functools.wraps(build)
    def get(clock: Clock, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if type(clock) is DatabaseClock:
            return memo(clock, *args, **kwargs)
        return build(clock, *args, **kwargs)

    return get


def read_now(conn: Connection, clock: Clock = DATABASE_CLOCK) -> float:
    """The clock's current value, read once: for ages computed in Python against
    times the store recorded on the same clock (a result's `observed_at`)."""
    return float(conn.execute(select(clock.now())).scalar_one())
