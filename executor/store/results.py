"""What a statement run at driver level returns (`driver.py`, `wire.py`): its rows,
fetched in full, with the part of SQLAlchemy's `Row` and `Result` the store's hot
functions use."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class DriverRow:
    """A result row: attribute access by column name and `_mapping`, as a `Row` has."""

    __slots__ = ("_mapping",)

    def __init__(self, mapping: dict[str, Any]) -> None:
        self._mapping = mapping

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        return f"DriverRow({self._mapping!r})"


class DriverResult:
    """The rows of one statement, fetched in full (the hot statements return at most a
    handful)."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[DriverRow], rowcount: int = -1) -> None:
        self._rows = rows
        self.rowcount = rowcount  # rows the statement changed or returned, as the cursor says

    def one_or_none(self) -> DriverRow | None:
        if len(self._rows) > 1:
            raise ValueError("the statement returned more than one row")
        return self._rows[0] if self._rows else None

    def first(self) -> DriverRow | None:
        return self._rows[0] if self._rows else None

    def all(self) -> list[DriverRow]:
        return list(self._rows)

    def scalars(self) -> Iterator[Any]:
        return (next(iter(row._mapping.values())) for row in self._rows)

    def scalar_one(self) -> Any:
        row = self.one_or_none()
        if row is None:
            raise ValueError("the statement returned no row")
        return next(iter(row._mapping.values()))

    def scalar_one_or_none(self) -> Any:
        row = self.one_or_none()
        return None if row is None else next(iter(row._mapping.values()))
