"""Where "now" comes from in the store's SQL.

Production uses the database's clock, so every worker agrees on lease expiry.
Tests inject a `ManualClock` to step time deterministically.
"""

from __future__ import annotations

import threading
from typing import Protocol

from sqlalchemy import ColumnElement, Float, literal

from executor.db import db_now


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
