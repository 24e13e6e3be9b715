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
    bindparam,
    cast,
    insert,
    literal,
    select,
)

from executor.core.states import State
from executor.store.clock import Clock, built_once
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


def event_params(
    decision_code: str, *, actor: str | None = None, duration_ms: float | None = None
) -> dict[str, Any]:
    """The bound parameters of an event statement (`event_statement`, `event_from`)."""
    return {"event_decision": decision_code, "event_actor": actor, "event_duration_ms": duration_ms}


def _bound(name: str, column: Any) -> Any:
    # Typed and cast: in an INSERT … SELECT a bare NULL parameter has no type.
    return cast(bindparam(name, type_=column.type), column.type)


def _state_literal(state: State | None, column: Any) -> Any:
    return cast(literal(state.value if state else None, column.type), column.type)


@built_once
def event_statement(clock: Clock, from_state: State | None, to_state: State) -> Insert:
    """The INSERT of one event for `from_state → to_state`, built once per pair: the
    row's columns bind as `event_<column>`, the rest as `event_params`."""
    return insert(audit_events).values(
        operation_id=bindparam("event_operation_id"),
        call_id=bindparam("event_call_id"),
        tool_name=bindparam("event_tool_name"),
        schema_version=bindparam("event_schema_version"),
        from_state=_state_literal(from_state, audit_events.c.from_state),
        to_state=_state_literal(to_state, audit_events.c.to_state),
        decision_code=bindparam("event_decision"),
        generation=bindparam("event_generation"),
        intent_hash=bindparam("event_intent_hash"),
        actor=bindparam("event_actor", type_=audit_events.c.actor.type),
        at=clock.now(),
        duration_ms=bindparam("event_duration_ms", type_=audit_events.c.duration_ms.type),
    )


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
        event_statement(clock, from_state, to_state),
        {
            **{f"event_{column.name}": row._mapping[column.name] for column in AUDIT_COLUMNS},
            **event_params(decision_code, actor=actor, duration_ms=duration_ms),
        },
    )


def event_from(moved: CTE, from_state: State | None, to_state: State, clock: Clock) -> Insert:
    """`append_event` as an INSERT … SELECT from a CTE of the updated row (PostgreSQL):
    the transition and its event in one statement, with the same columns. The
    decision, actor and duration bind as `event_params`."""
    c = audit_events.c
    return insert(audit_events).from_select(
        ["operation_id", "call_id", "tool_name", "schema_version", "from_state", "to_state",
         "decision_code", "generation", "intent_hash", "actor", "at", "duration_ms"],
        select(
            moved.c.operation_id, moved.c.call_id, moved.c.tool_name, moved.c.schema_version,
            _state_literal(from_state, c.from_state), _state_literal(to_state, c.to_state),
            _bound("event_decision", c.decision_code),
            moved.c.generation, moved.c.intent_hash, _bound("event_actor", c.actor), clock.now(),
            _bound("event_duration_ms", c.duration_ms),
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
