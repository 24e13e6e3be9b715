"""The downstream an eval judges side effects by: its own records, not toolfence's.

A fixtures file names one (`"downstream": "module:attribute"`). It prepares the
state its cases need (accounts, invoices, ...) and counts, from its own tables,
what the operations of a case actually did. toolfence's own records (operation
states, results) say what the executor believes happened; a side effect counts
only when the downstream recorded it.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from executor.eval.fixtures import FixtureError

if TYPE_CHECKING:
    from executor.eval.fixtures import Case


@runtime_checkable
class Downstream(Protocol):
    def prepare(self, database_url: str, cases: Sequence[Case]) -> None:
        """Create the downstream's schema and each case's `setup`; idempotent (a resumed
        run prepares again)."""
        ...

    def effects(self, database_url: str, operation_ids: Sequence[str]) -> dict[str, int]:
        """How many effects of each kind the downstream recorded for these operations."""
        ...

    def effect_of(self, tool: str) -> str | None:
        """The kind of effect one call of `tool` records (None: a read, no effect)."""
        ...


def load_downstream(spec: str) -> Downstream:
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FixtureError(f"downstream {spec!r}: cannot import {module_name!r} ({exc})") from None
    found = getattr(module, attribute, None)
    if not isinstance(found, Downstream):
        raise FixtureError(f"downstream {spec!r}: no object with prepare, effects and effect_of there")
    return found
