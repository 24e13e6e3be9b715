"""Times as a person or a script reads them: ISO 8601 in UTC, to the millisecond,
with a `Z` (`2026-12-05T07:51:44.123Z`).

toolfence stores and compares times as epoch seconds (floats, the database's
clock); every place that shows one (the CLI's output, human and `--json`, the
HTTP API's JSON, a provider's result envelope) writes it through `iso_utc`, so a
reader never has to guess a unit or a zone.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload


@overload
def iso_utc(epoch_seconds: float) -> str: ...


@overload
def iso_utc(epoch_seconds: None) -> None: ...


def iso_utc(epoch_seconds: float | None) -> str | None:
    """`epoch_seconds` as ISO 8601 UTC to the millisecond; None stays None."""
    if epoch_seconds is None:
        return None
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
