"""How the console's pages show values: times in ISO 8601 UTC, ages, amounts by the
tool's display hint, receipts once each, and the lists' filters read from a query.
Pure functions over what the Service returned; the templates call them as filters."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from executor.core.amounts import Amount
from executor.http.cards import iso
from executor.store.console_reads import Cursor, Filters


def age(seconds: float) -> str:
    if seconds < 90:
        return f"{int(seconds)} s"
    if seconds < 5400:
        return f"{int(seconds // 60)} min"
    return f"{seconds / 3600:.1f} h"


def iso_time(seconds: float | None) -> str:
    return iso(seconds) or ""


def plural(count: int, word: str) -> str:
    """`1 attempt`, `2 attempts`: never `1 (1 attempts)`."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def is_structured(value: Any) -> bool:
    return isinstance(value, Mapping | list | tuple)


@dataclass(frozen=True)
class ImpactRow:
    name: str
    value: Any
    shown: str | None  # the amount as its hint formats it; None: shown as it is


def impact_rows(impact: Mapping[str, Any], amounts: Mapping[str, Any]) -> list[ImpactRow]:
    """The card's impact in the hook's order, each amount formatted by the tool's hint."""
    rows = []
    for name, value in impact.items():
        hint = amounts.get(name)
        shown = Amount(hint.currency, hint.decimals).format(value) if hint is not None else None
        rows.append(ImpactRow(name, value, shown))
    return rows


@dataclass(frozen=True)
class ReceiptRow:
    receipt: str
    accepted: bool
    seen: str  # who reported it, at which generation, in order


def receipt_rows(receipts: Iterable[Any]) -> list[ReceiptRow]:
    """One row per distinct receipt (a worker's and then the operator's report of the
    same reference are one receipt, seen twice), accepted when any report was."""
    order: list[str] = []
    accepted: dict[str, bool] = {}
    seen: dict[str, list[str]] = {}
    for r in receipts:
        if r.receipt not in accepted:
            order.append(r.receipt)
            accepted[r.receipt] = False
            seen[r.receipt] = []
        accepted[r.receipt] = accepted[r.receipt] or bool(r.accepted)
        seen[r.receipt].append(
            f"{r.source}, generation {r.generation}" + ("" if r.accepted else ", refused")
        )
    return [ReceiptRow(x, accepted[x], "; ".join(seen[x])) for x in order]


def parse_time(text: str | None) -> float | None:
    """An ISO 8601 time (a `datetime-local` field's `2026-12-05T07:53`, or with a
    zone) as epoch seconds; a time without a zone is UTC. None: absent or unreadable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def principal_key(principal: str) -> str:
    """How a list's principal filter names a principal (in its form and URL)."""
    return hashlib.sha256(principal.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True)
class ListQuery:
    """A list page's filters as the form shows them, and as the store reads them."""

    form: dict[str, str]
    filters: Filters
    after: Cursor | None
    unreadable: list[str]  # fields whose value was ignored (shown, never echoed)


FILTER_FIELDS = ("state", "tool", "principal", "since", "until")


def list_query(
    params: Mapping[str, str], states: Iterable[str], tools: Iterable[str], principals: Iterable[str]
) -> ListQuery:
    """Filters from a list page's query. A state, tool or principal that is not one of
    the known values, or a time that does not parse, is ignored and named (never an
    error page, and never shown: a page shows no text from its URL)."""
    form = {name: params.get(name, "").strip()[:200] for name in FILTER_FIELDS}
    unreadable: list[str] = []
    state = form["state"] or None
    if state is not None and state not in set(states):
        unreadable.append("state")
        state = None
        form["state"] = ""
    tool = form["tool"] or None
    if tool is not None and tool not in set(tools):
        unreadable.append("tool")
        tool = None
        form["tool"] = ""
    # The form names a principal by its digest: a principal is never written into the
    # page raw (a secret-shaped one is shown redacted), and the URL names only a key
    # of a closed set.
    by_digest = {principal_key(x): x for x in principals}
    principal = by_digest.get(form["principal"]) if form["principal"] else None
    if form["principal"] and principal is None:
        unreadable.append("principal")
        form["principal"] = ""
    times: dict[str, float | None] = {}
    for name in ("since", "until"):
        times[name] = parse_time(form[name])
        if form[name] and times[name] is None:
            unreadable.append(name)
            form[name] = ""
    filters = Filters(
        state=state or None, tool=tool, principal=principal,
        since=times["since"], until=times["until"],
    )
    return ListQuery(form, filters, Cursor.decode(params.get("after")), unreadable)


def page_link(path: str, form: Mapping[str, str], after: Cursor | None) -> str | None:
    """The next page's URL: the same filters, after the last row shown."""
    from urllib.parse import urlencode

    if after is None:
        return None
    query = {k: v for k, v in form.items() if v}
    query["after"] = after.encode()
    return f"{path}?{urlencode(query)}"
