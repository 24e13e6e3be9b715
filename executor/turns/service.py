"""The turn API an application (or `toolfence serve`) calls: start a turn, read it.

`start_turn` writes the turn row and its outbox row in the caller's transaction
and returns at once (HTTP answers 202 with it); a worker runs the loop. A
second running turn of the same user (or conversation, by setting) is refused
`turn_in_progress` by the partial unique index, not by a check here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from executor.core.sanitize import redact_json, seal_final_output, shown_text
from executor.core.types import ErrorCode, ServerContext
from executor.errors import TurnError
from executor.settings import Settings
from executor.store import turns as turn_store
from executor.store.engine import read_only
from executor.telemetry import tracing
from executor.turns.contract import proposals_from_json
from executor.turns.values import StepOutcome, StepRecord, TurnOptions, Usage

if TYPE_CHECKING:
    from executor.core.tools import Registry

SCOPES = ("principal", "conversation")
TURN_ID_MAX_CHARS = 64
"""`toolfence_turns.turn_id` is `String(64)`: a caller-chosen turn id is at most this."""
DRIVER_MAX_CHARS = 1000
"""`toolfence_turns.driver` is `String(1000)`."""
WHEN_BUSY = ("refuse", "queue")


class TurnInProgress(TurnError):
    """The user (or conversation) already has a running turn: nothing was written."""

    code = ErrorCode.TURN_IN_PROGRESS

    def __init__(self, tenant: str, scope: str) -> None:
        super().__init__(f"a turn of this {scope} is already running")
        self.tenant = tenant
        self.scope = scope


@dataclass(frozen=True)
class TurnHandle:
    turn_id: str
    state: str


def scope_key(scope: str, context: ServerContext, conversation_id: str) -> str:
    """What the unique index counts running turns over: the principal, or the
    conversation (`TOOLFENCE_TURN_SCOPE`)."""
    if scope == "principal":
        return f"principal:{context.principal}"
    if scope == "conversation":
        return f"conversation:{conversation_id}"
    raise ValueError(f"turn scope must be one of {SCOPES}")


def _connection(session: Session | Connection) -> Connection:
    return session.connection() if isinstance(session, Session) else session


def start_turn(
    session: Session | Connection,
    context: ServerContext,
    conversation_id: str,
    message: str,
    *,
    driver: str | None = None,
    options: TurnOptions | None = None,
    scope: str | None = None,
    when_busy: str | None = None,
    turn_id: str | None = None,
    surface: str | None = None,
    registry: Registry | None = None,
) -> TurnHandle:
    """Write a running turn (and its outbox row) in the caller's transaction.

    `context` is the server's: who asks (its roles reach admission, never the
    prompt). `driver` names the model (`scripted:FILE`, `openai-chat:MODEL`, …;
    default `TOOLFENCE_TURN_DRIVER`). When the scope already has a running turn:
    `when_busy="refuse"` (default `TOOLFENCE_TURN_WHEN_BUSY`) raises
    `TurnInProgress` and writes nothing, the caller's transaction staying usable;
    `"queue"` writes the turn `queued`, to run once the scope is free. `turn_id`
    (default: a fresh random one) lets a caller name the turn before it is written,
    as `toolfence serve` does for an `Idempotency-Key`. `surface` (default
    `TOOLFENCE_TURN_SURFACE`; unset: none) names a turn surface of `registry` (default
    the registry `TOOLFENCE_TOOLS` names): its catalog, write rule and listed targets
    apply to the whole turn (executor/core/surfaces.py); a surface the registry does
    not declare raises `UnknownSurface`, writing nothing. A context that already names
    a surface keeps it when `surface` is not given.

    Checked before anything is written, so the caller's transaction stays usable:
    the context's identifiers, `conversation_id` and `turn_id` (at most
    `TURN_ID_MAX_CHARS`) raise `InvalidIdentifier`; a driver spec that is not
    printable text of at most `DRIVER_MAX_CHARS`, or a message holding NUL or a lone
    surrogate (no database column holds them), raises `ValueError`.
    """
    settings = Settings.from_env()
    driver = driver or settings.turn_driver
    if not driver:
        raise ValueError("no driver: pass driver= or set TOOLFENCE_TURN_DRIVER")
    _check_turn_input(context, conversation_id, message, driver, turn_id)
    surface = surface or context.surface or settings.turn_surface
    if surface is not None:
        _check_surface(surface, registry, settings)
        context = context.model_copy(update={"surface": surface})
    options = options or TurnOptions(max_steps=settings.turn_max_steps)
    scope = scope or settings.turn_scope
    when_busy = when_busy or settings.turn_when_busy
    if when_busy not in WHEN_BUSY:
        raise ValueError(f"when_busy must be one of {WHEN_BUSY}")
    conn = _connection(session)
    turn_id = turn_id or turn_store.new_turn_id()
    stored_context = context.model_copy(
        update={"conversation_id": conversation_id, "turn_id": turn_id}
    ).to_json()
    with tracing.turn_span(context.tenant, turn_id):
        state = turn_store.insert_turn(
            conn, turn_id=turn_id, tenant=context.tenant, principal=context.principal,
            conversation_id=conversation_id, scope_key=scope_key(scope, context, conversation_id),
            context=stored_context, message=message, driver=driver, options=options.to_json(),
            queue_when_busy=when_busy == "queue", trace_context=tracing.stored_context(),
        )
    if state is None:
        from executor.telemetry import metrics

        metrics.TURNS_REFUSED.labels(ErrorCode.TURN_IN_PROGRESS.value).inc()
        raise TurnInProgress(context.tenant, scope)
    return TurnHandle(turn_id, state.value)


def _check_surface(name: str, registry: Registry | None, settings: Settings) -> None:
    from executor.core.identifiers import identifier_problem
    from executor.core.surfaces import UnknownSurface

    if identifier_problem(name, 64) is not None:
        raise UnknownSurface(name)
    if registry is None:
        from executor.core.tools import load_registry

        registry = load_registry(settings.require_tools())
    if registry.surface(name) is None:
        raise UnknownSurface(name)


def step_record(row: Any) -> StepRecord:
    return StepRecord(
        step=row.step, outcome=StepOutcome(row.outcome),
        proposals=proposals_from_json(json.loads(row.proposals)), request_id=row.request_id,
        usage=Usage.from_json(json.loads(row.usage)), final_output=row.final_output,
        error=json.loads(row.error) if row.error else None, verdict=row.verdict,
        offered=tuple(json.loads(row.offered)) if row.offered is not None else None,
        trace_context=row.trace_context,
    )


def get_turn(
    session: Session | Connection | Engine, tenant: str, turn_id: str
) -> dict[str, Any] | None:
    """The turn as a JSON-able dict, or None when the tenant has no such turn (another
    tenant's turn is not seen). Steps with their calls' results, the end state,
    reason and final output. Never the prompts or the model's raw responses. What a
    person reads passes the sanitiser (rows stored before the store sealed them too):
    a secret-shaped principal, a secret in the final output, the message or an error
    is shown redacted, whoever asks (CLI, API, console)."""
    if isinstance(session, Engine):
        with read_only(session).connect() as conn:
            return get_turn(conn, tenant, turn_id)
    from outbox.results import results

    conn = _connection(session)
    row = turn_store.get_turn(conn, turn_id)
    if row is None or row.tenant != tenant:
        return None
    steps: list[dict[str, Any]] = []
    for step_row in turn_store.steps_of(conn, turn_id):
        record = step_record(step_row)
        statuses = results(conn, tenant, record.request_id) if record.proposals else []
        steps.append({
            "step": record.step,
            "outcome": record.outcome.value,
            "verdict": record.verdict,
            "usage": record.usage.to_json(),
            "final_output": seal_final_output(record.final_output),
            "error": redact_json(record.error) if record.error is not None else None,
            "calls": [s.model_dump(mode="json", exclude_none=True) for s in statuses],
            "proposed": [{"call_id": p.call_id, "tool_name": p.tool_name} for p in record.proposals],
            "listed": list(record.offered) if record.offered is not None else None,
        })
    return {
        "turn_id": row.turn_id,
        "tenant": row.tenant,
        "principal": shown_text(row.principal),
        "conversation_id": row.conversation_id,
        "state": row.state,
        "end_reason": row.end_reason,
        "final_output": seal_final_output(row.final_output),
        "error": redact_json(json.loads(row.error)) if row.error else None,
        "message": seal_final_output(row.message),
        "surface": json.loads(row.context).get("surface"),
        "generation": row.generation,
        "steps": steps,
        "options": json.loads(row.options),
        "created_at": row.created_at,
        "finished_at": row.finished_at,
    }


def turn_summary(view: Mapping[str, Any]) -> str:
    """`toolfence turn show` without --json: state, steps, calls with results, final."""
    lines = [f"turn {view['turn_id']}  state {view['state']}"
             + (f"  ({view['end_reason']})" if view.get("end_reason") else "")]
    if view.get("surface"):
        # The surface the turn ran under: its catalog and its write rule.
        lines.append(f"  surface {shown_text(view['surface'])}")
    if view.get("error"):
        # Why it fell back or failed (a driver that could not answer, a surface gone):
        # the turn's own error, already through the sanitiser.
        error = view["error"]
        reason = (
            f"{error.get('code', 'error')}: {error.get('message', '')}".rstrip(": ")
            if isinstance(error, Mapping) else json.dumps(error)
        )
        lines.append(f"  why: {reason[:500]}")
    for step in view["steps"]:
        usage = step["usage"]
        head = f"  step {step['step']}: {step['outcome']}"
        if step.get("verdict"):
            head += f" {step['verdict']}"
        head += f"  [{usage['model']} {usage['input_tokens']}+{usage['output_tokens']} tokens]"
        lines.append(head)
        for call in step["calls"]:
            if call["status"] == "succeeded":
                shown = json.dumps(call.get("output"), sort_keys=True)
            elif call["status"] == "pending":
                shown = call.get("state", "")
            else:
                shown = call["error"]["code"]
            lines.append(f"    {call['call_id']} {call['tool_name']} {call['status']}: {shown[:200]}")
        if step.get("final_output"):
            lines.append(f"    final: {step['final_output'][:500]}")
        if step.get("error"):
            lines.append(f"    error: {json.dumps(step['error'])[:300]}")
    if view.get("final_output") is not None:
        lines.append(f"final output: {view['final_output']}")
    return "\n".join(lines)


def _check_turn_input(
    context: ServerContext, conversation_id: str, message: str, driver: str, turn_id: str | None
) -> None:
    """What `start_turn` writes into bounded columns (and a message no text column
    holds), checked before the insert: PostgreSQL would abort the caller's transaction."""
    from executor.core.identifiers import (
        IdentifierField,
        InvalidIdentifier,
        check_identifier,
        check_server_context,
        identifier_problem,
    )
    from executor.core.strictjson import contains_lone_surrogate

    check_server_context(context)
    check_identifier(IdentifierField.CONVERSATION_ID, conversation_id)
    if turn_id is not None and (problem := identifier_problem(turn_id, TURN_ID_MAX_CHARS)):
        raise InvalidIdentifier(IdentifierField.TURN_ID, problem)
    if identifier_problem(driver, DRIVER_MAX_CHARS) is not None:
        raise ValueError(f"a turn driver spec is printable text of at most {DRIVER_MAX_CHARS} characters")
    if "\x00" in message or contains_lone_surrogate(message):
        raise ValueError("a turn message is UTF-8 text without NUL or lone surrogates")
