"""What the console's lists and cards read: operations, requests and turns of one
tenant, filtered and newest first, paginated by keyset; the active operations that
share a card's resources; an operation's approval decision.

Every query is scoped by the caller's tenant. A page is `limit` rows after a cursor
(the last row's `(created_at, id)`): a row written while a person pages never shifts
what the next page shows, and the cost of a page does not grow with its depth.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    and_,
    cast,
    exists,
    func,
    or_,
    select,
    tuple_,
)
from sqlalchemy.dialects.postgresql import JSONB

from executor.store.schema import ACTIVE_STATES, api_keys, approvals, calls, operations, turn_steps, turns

MAX_PAGE = 100
# The newest operations whose principals a list's principal filter offers, at most.
PRINCIPAL_SCAN = 1_000
# The active operations a card compares its resources with, at most.
MAX_ACTIVE_SCAN = 500


@dataclass(frozen=True)
class Filters:
    """A list's filters; None: not filtered. Times are epoch seconds (database clock)."""

    state: str | None = None
    tool: str | None = None
    principal: str | None = None
    since: float | None = None
    until: float | None = None


@dataclass(frozen=True)
class Cursor:
    """Where a page ends: the last row's creation time and id (rows are newest first)."""

    created_at: float
    key: str

    def encode(self) -> str:
        return f"{self.created_at!r}~{self.key}"

    @classmethod
    def decode(cls, text: str | None) -> Cursor | None:
        """None for an absent or malformed cursor (the first page)."""
        if not text or "~" not in text:
            return None
        at, _, key = text.partition("~")
        try:
            value = float(at)
        except ValueError:
            return None
        if value != value or not key:  # NaN
            return None
        return cls(value, key)


@dataclass(frozen=True)
class Page:
    rows: list[Row[Any]]
    next: Cursor | None


def _principal_of(conn: Connection, context: Any) -> ColumnElement[Any]:
    """The principal in a stored context (JSON text), per dialect."""
    if conn.dialect.name == "postgresql":
        found: ColumnElement[Any] = cast(context, JSONB)["principal"].astext
        return found
    return func.json_extract(context, "$.principal")


def _page(conn: Connection, query: Any, limit: int, at: Any, key: Any, after: Cursor | None) -> Page:
    if after is not None:
        query = query.where(tuple_(at, key) < tuple_(after.created_at, after.key))
    rows = list(conn.execute(query.order_by(at.desc(), key.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1] if more and rows else None
    return Page(rows, Cursor(float(last.created_at), str(last.key)) if last is not None else None)


def _operation_filters(conn: Connection, tenant: str, f: Filters, *, with_state: bool = True) -> list[Any]:
    where: list[Any] = [operations.c.tenant == tenant]
    if with_state and f.state:
        where.append(operations.c.state == f.state)
    if f.tool:
        where.append(operations.c.tool_name == f.tool)
    if f.principal:
        where.append(_principal_of(conn, operations.c.context) == f.principal)
    if f.since is not None:
        where.append(operations.c.created_at >= f.since)
    if f.until is not None:
        where.append(operations.c.created_at < f.until)
    return where


def list_operations(
    conn: Connection, tenant: str, f: Filters, after: Cursor | None = None, limit: int = 50,
    *, request_id: str | None = None,
) -> Page:
    where = _operation_filters(conn, tenant, f)
    if request_id is not None:
        where.append(operations.c.request_id == request_id)
    query = select(
        operations.c.operation_id.label("key"), operations.c.operation_id, operations.c.request_id,
        operations.c.call_id, operations.c.tool_name, operations.c.state, operations.c.error_code,
        operations.c.context, operations.c.created_at, operations.c.updated_at,
    ).where(*where)
    return _page(conn, query, min(limit, MAX_PAGE), operations.c.created_at, operations.c.operation_id, after)


def operation_state_counts(conn: Connection, tenant: str, f: Filters) -> dict[str, int]:
    """How many of the tenant's operations each state holds, under every filter but state."""
    rows = conn.execute(
        select(operations.c.state, func.count())
        .where(*_operation_filters(conn, tenant, f, with_state=False))
        .group_by(operations.c.state)
    )
    return {str(state): int(count) for state, count in rows}


def list_requests(
    conn: Connection, tenant: str, f: Filters, after: Cursor | None = None, limit: int = 50
) -> Page:
    """Requests (a producer's batch of calls) newest first; `state` and `principal` match
    a request having such an operation (a request whose every call was refused at
    admission has no operation, so no principal: it shows unfiltered only)."""
    at = func.min(calls.c.created_at)
    query = (
        select(
            calls.c.request_id.label("key"), calls.c.request_id, at.label("created_at"),
            func.count().label("calls"), func.max(calls.c.conversation_id).label("conversation_id"),
        )
        .where(calls.c.tenant == tenant)
        .group_by(calls.c.request_id)
    )
    if f.tool:
        other = calls.alias("other")
        query = query.where(
            exists().where(
                other.c.tenant == calls.c.tenant, other.c.request_id == calls.c.request_id,
                other.c.tool_name == f.tool,
            )
        )
    op_terms: list[Any] = []
    if f.state:
        op_terms.append(operations.c.state == f.state)
    if f.principal:
        op_terms.append(_principal_of(conn, operations.c.context) == f.principal)
    if op_terms:
        query = query.where(
            exists().where(
                operations.c.tenant == calls.c.tenant, operations.c.request_id == calls.c.request_id,
                *op_terms,
            )
        )
    if f.since is not None:
        query = query.having(at >= f.since)
    if f.until is not None:
        query = query.having(at < f.until)
    if after is not None:
        query = query.having(
            or_(at < after.created_at, and_(at == after.created_at, calls.c.request_id < after.key))
        )
    size = min(limit, MAX_PAGE)
    rows = list(conn.execute(query.order_by(at.desc(), calls.c.request_id.desc()).limit(size + 1)))
    more = len(rows) > size
    rows = rows[:size]
    last = rows[-1] if more and rows else None
    return Page(rows, Cursor(float(last.created_at), str(last.key)) if last is not None else None)


def request_operation_states(
    conn: Connection, tenant: str, request_ids: Sequence[str]
) -> dict[str, dict[str, int]]:
    """Per request, how many of its operations each state holds."""
    found: dict[str, dict[str, int]] = {}
    if not request_ids:
        return found
    rows = conn.execute(
        select(operations.c.request_id, operations.c.state, func.count())
        .where(operations.c.tenant == tenant, operations.c.request_id.in_(list(request_ids)))
        .group_by(operations.c.request_id, operations.c.state)
    )
    for request_id, state, count in rows:
        found.setdefault(str(request_id), {})[str(state)] = int(count)
    return found


def request_tools(conn: Connection, tenant: str, request_ids: Sequence[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    if not request_ids:
        return found
    rows = conn.execute(
        select(calls.c.request_id, calls.c.tool_name)
        .where(calls.c.tenant == tenant, calls.c.request_id.in_(list(request_ids)))
        .order_by(calls.c.request_id, calls.c.position)
    )
    for request_id, tool in rows:
        found.setdefault(str(request_id), []).append(str(tool))
    return found


def list_turns(
    conn: Connection, tenant: str, f: Filters, after: Cursor | None = None, limit: int = 50
) -> Page:
    """Turns newest first; `tool` matches a turn one of whose steps proposed that tool."""
    where: list[Any] = [turns.c.tenant == tenant]
    if f.state:
        where.append(turns.c.state == f.state)
    if f.principal:
        where.append(turns.c.principal == f.principal)
    if f.tool:
        where.append(
            exists().where(
                turn_steps.c.turn_id == turns.c.turn_id, calls.c.tenant == tenant,
                calls.c.request_id == turn_steps.c.request_id, calls.c.tool_name == f.tool,
            )
        )
    if f.since is not None:
        where.append(turns.c.created_at >= f.since)
    if f.until is not None:
        where.append(turns.c.created_at < f.until)
    query = select(
        turns.c.turn_id.label("key"), turns.c.turn_id, turns.c.principal, turns.c.conversation_id,
        turns.c.state, turns.c.end_reason, turns.c.steps, turns.c.created_at, turns.c.finished_at,
    ).where(*where)
    return _page(conn, query, min(limit, MAX_PAGE), turns.c.created_at, turns.c.turn_id, after)


def active_operations(conn: Connection, tenant: str) -> list[Row[Any]]:
    """The tenant's operations that may still move (pending approval, queued, running,
    waiting for a retry or a person), newest first, at most MAX_ACTIVE_SCAN."""
    return list(
        conn.execute(
            select(
                operations.c.operation_id, operations.c.tool_name, operations.c.state,
                operations.c.arguments, operations.c.context, operations.c.approved_resources,
                operations.c.created_at,
            )
            .where(operations.c.tenant == tenant, operations.c.state.in_(ACTIVE_STATES))
            .order_by(operations.c.created_at.desc())
            .limit(MAX_ACTIVE_SCAN)
        )
    )


@dataclass(frozen=True)
class ApprovalDecisionRecord:
    """How an operation's approval ended (or that it is still pending)."""

    state: str
    decided_by: str | None
    decided_at: float | None
    reason: str | None
    impact: dict[str, Any]


def approval_decision(conn: Connection, operation_id: str) -> ApprovalDecisionRecord | None:
    row = conn.execute(
        select(approvals.c.state, approvals.c.decided_by, approvals.c.decided_at, approvals.c.reason,
               approvals.c.impact)
        .where(approvals.c.operation_id == operation_id)
    ).one_or_none()
    if row is None:
        return None
    return ApprovalDecisionRecord(
        state=row.state, decided_by=row.decided_by, decided_at=row.decided_at, reason=row.reason,
        impact=json.loads(row.impact),
    )


def known_principals(conn: Connection, tenant: str) -> list[str]:
    """The principals a list may be filtered by: the tenant's API keys', its turns',
    and those of its newest PRINCIPAL_SCAN operations. A closed set, so the filter
    never shows text that came from a URL."""
    keys = select(api_keys.c.principal).where(api_keys.c.tenant == tenant).distinct()
    turned = select(turns.c.principal).where(turns.c.tenant == tenant).distinct()
    found = set(conn.execute(keys).scalars()) | set(conn.execute(turned).scalars())
    contexts = conn.execute(
        select(operations.c.context)
        .where(operations.c.tenant == tenant)
        .order_by(operations.c.created_at.desc())
        .limit(PRINCIPAL_SCAN)
    ).scalars()
    for context in contexts:
        try:
            principal = json.loads(context).get("principal")
        except (ValueError, AttributeError):
            continue
        if isinstance(principal, str):
            found.add(principal)
    return sorted(found)
