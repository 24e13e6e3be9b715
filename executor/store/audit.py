"""The append-only audit trail: one event per state transition, in the same transaction."""

from __future__ import annotations

import json
import re
from typing import Any

from sqlalchemy import (
    CTE,
    Connection,
    Insert,
    Row,
    cast,
    insert,
    literal,
    select,
)

from executor.core.states import State
from executor.store.clock import Clock
from executor.store.schema import audit_events, operations

AUDIT_COLUMNS = (
    operations.c.operation_id,
    operations.c.call_id,
    operations.c.tool_name,
    operations.c.schema_version,
    operations.c.generation,
    operations.c.intent_hash,
)


DECISION_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def append_event(
    conn: Connection,
    row: Any,
    from_state: State | None,
    to_state: State,
    decision_code: str,
    clock: Clock,
    *,
    actor: str | None = None,
    duration_ms: float | None = None,
) -> None:
    """Append-only: one event per transition. Never arguments or the owner token."""
    conn.execute(
        insert(audit_events).values(
            operation_id=row.operation_id,
            call_id=row.call_id,
            tool_name=row.tool_name,
            schema_version=row.schema_version,
            from_state=from_state.value if from_state else None,
            to_state=to_state.value,
            decision_code=decision_code,
            generation=row.generation,
            intent_hash=row.intent_hash,
            actor=actor,
            at=clock.now(),
            duration_ms=duration_ms,
        )
    )


def event_from(
    moved: CTE,
    from_state: State | None,
    to_state: State,
    decision_code: str,
    clock: Clock,
    *,
    actor: str | None = None,
    duration_ms: float | None = None,
) -> Insert:
    """`append_event` as an INSERT … SELECT from a CTE of the updated row (PostgreSQL):
    the transition and its event in one statement, with the same columns."""
    c = audit_events.c

    def value(v: Any, column: Any) -> Any:
        return cast(literal(v, column.type), column.type)

    return insert(audit_events).from_select(
        ["operation_id", "call_id", "tool_name", "schema_version", "from_state", "to_state",
         "decision_code", "generation", "intent_hash", "actor", "at", "duration_ms"],
        select(
            moved.c.operation_id, moved.c.call_id, moved.c.tool_name, moved.c.schema_version,
            value(from_state.value if from_state else None, c.from_state),
            value(to_state.value, c.to_state), value(decision_code, c.decision_code),
            moved.c.generation, moved.c.intent_hash, value(actor, c.actor), clock.now(),
            value(duration_ms, c.duration_ms),
        ),
    )


def audit_trail(conn: Connection, operation_id: str) -> list[Row[Any]]:
    return list(
        conn.execute(
            select(audit_events)
            .where(audit_events.c.operation_id == operation_id)
            .order_by(audit_events.c.event_id)
        )
    )
