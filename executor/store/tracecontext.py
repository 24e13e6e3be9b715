"""The trace context stored with an operation (`toolfence_operations.trace_context`).

What is stored is `executor.telemetry.tracing`'s to write and read: the W3C trace
context of the request span that registered the operation and of its last
execution attempt's span, as one JSON object. It is written at registration (in
the INSERT, `registration.py`) and by the worker once a reservation won, never
read for a decision: it changes no state, so no CAS, no audit event. Both
statements run only when tracing is on.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, select, update

from executor.core.states import State
from executor.store.schema import operations


def save_attempt_trace(conn: Connection, operation_id: str, owner_token: str, trace_context: str) -> bool:
    """Store `trace_context` (the request's and this attempt's) on an operation this
    reservation still holds; False when it no longer does (nothing changed)."""
    result = conn.execute(
        update(operations)
        .where(
            operations.c.operation_id == operation_id,
            operations.c.owner_token == owner_token,
            operations.c.state == State.STARTED.value,
        )
        .values(trace_context=trace_context)
    )
    return bool(result.rowcount)


def trace_contexts(conn: Connection, operation_ids: Sequence[str]) -> dict[str, str]:
    """operation id → its stored trace context, for those that have one."""
    if not operation_ids:
        return {}
    rows = conn.execute(
        select(operations.c.operation_id, operations.c.trace_context).where(
            operations.c.operation_id.in_(list(operation_ids)),
            operations.c.trace_context.is_not(None),
        )
    )
    return {row.operation_id: row.trace_context for row in rows}
