"""A turn surface's built-in target source: the requester's own open items.

`open_items()` lists, newest first, the requester's operations that wait for a
person (pending cards) and then the recent operations of the turn's
conversation: what "cancel that one" or "what happened to the transfer" can
point at. Each item's id is the operation id; its label is the server's (tool,
state, when), never text a model or a tool wrote. Another principal's
operations, even of the same tenant and conversation, are never listed.

An application lists its own items (orders, bookings) with any callable
`(connection, context) -> Iterable[Target]` (executor/core/surfaces.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, select

from executor.core.states import State
from executor.core.surfaces import Target, TargetSource
from executor.core.types import ServerContext
from executor.store.schema import operations

SCAN_LIMIT = 200
"""Rows read per kind before the principal filter (the principal is in the stored
context, not a column): a bound on the cost of one step's list."""


def open_items(*, pending: bool = True, recent: int = 10) -> TargetSource:
    """A target source: the requester's pending approvals (all of them, up to the
    surface's `max_targets`), then up to `recent` operations of the conversation."""

    def source(conn: Connection, context: ServerContext) -> Iterator[Target]:
        if pending:
            rows = conn.execute(
                select(operations.c.operation_id, operations.c.tool_name, operations.c.state,
                       operations.c.created_at, operations.c.context)
                .where(operations.c.tenant == context.tenant,
                       operations.c.state == State.PENDING_APPROVAL.value)
                .order_by(operations.c.created_at.desc())
                .limit(SCAN_LIMIT)
            ).all()
            yield from _items(rows, context, limit=SCAN_LIMIT)
        if recent > 0 and context.conversation_id is not None:
            rows = conn.execute(
                select(operations.c.operation_id, operations.c.tool_name, operations.c.state,
                       operations.c.created_at, operations.c.context)
                .where(operations.c.tenant == context.tenant,
                       operations.c.conversation_id == context.conversation_id,
                       operations.c.state != State.PENDING_APPROVAL.value)
                .order_by(operations.c.created_at.desc())
                .limit(SCAN_LIMIT)
            ).all()
            yield from _items(rows, context, limit=recent)

    return source


def _items(rows: Sequence[Any], context: ServerContext, *, limit: int) -> Iterator[Target]:
    shown = 0
    for row in rows:
        if shown >= limit:
            return
        try:
            principal = json.loads(row.context).get("principal")
        except (ValueError, AttributeError):
            continue
        if principal != context.principal:
            continue
        when = datetime.fromtimestamp(row.created_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
        shown += 1
        yield Target(row.operation_id, f"{row.tool_name}, {row.state.replace('_', ' ')}, asked {when}")
