"""The producer's read side: what became of a request's calls.

`results` answers exactly one status per proposed call of a request, in proposal
order (I6), only within the caller's tenant; `settled` says whether a status can
still change without a person, `final` what to tell a model whose turn must end
now, and `wait_for_results` polls until a request is settled. A status is read from
the call row's stored answer (a refusal, a repeat) or from its operation; a success
says how old it is on the database clock. Nothing here writes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session

from executor import store
from executor.core.sanitize import sanitize_json
from executor.core.states import State
from executor.core.types import (
    CallStatus,
    ErrorCode,
    ErrorDetail,
    FailedRetryable,
    FailedTerminal,
    Pending,
    ServerContext,
    Succeeded,
    ToolError,
)
from executor.store.engine import read_only
from executor.store.errors import store_errors
from executor.store.schema import approvals
from executor.store.schema import calls as calls_table


def connection_of(session: Session | Connection) -> Connection:
    """The connection of the caller's session (or the connection itself)."""
    return session.connection() if isinstance(session, Session) else session


def _model_view(stored: Any) -> Any:
    """What the model may see of a stored success. Results stored since results are
    sealed carry their sanitised `model_view`; older rows and an operator's
    resolution carry none, so theirs is sanitised here, on the way out."""
    if isinstance(stored, dict) and "model_view" in stored:
        return stored["model_view"]
    return sanitize_json(stored.get("output") if isinstance(stored, dict) else stored)


def operation_status(
    call_id: str, tool_name: str, row: Any, *, now: float | None = None
) -> CallStatus:
    """The caller-facing status of one operation row, for one call id.

    `now` is the database clock at read time (`store.read_now`): a success then says
    how old it is, and whether that is past its tool's max age.
    """
    state = State(row.state)
    if state is State.SUCCEEDED:
        stored = json.loads(row.result) if row.result else {}
        return Succeeded(
            call_id=call_id, tool_name=tool_name, operation_id=row.operation_id,
            output=_model_view(stored),
            untrusted=bool(stored.get("untrusted")) if isinstance(stored, dict) else False,
            **_freshness(row, stored if isinstance(stored, dict) else {}, now),
        )
    if state is State.FAILED_TERMINAL:
        error = json.loads(row.error) if row.error else {}
        return FailedTerminal(
            call_id=call_id, tool_name=tool_name, operation_id=row.operation_id,
            error=ToolError(
                code=ErrorCode(row.error_code or ErrorCode.EXECUTION_FAILED),
                message=str(error.get("message", "")),
                details=tuple(error.get("details", ())),
            ),
        )
    impact = json.loads(row.impact) if (row.impact and state is State.PENDING_APPROVAL) else None
    return Pending(
        call_id=call_id, tool_name=tool_name, operation_id=row.operation_id, state=state.value,
        impact=impact,
    )


def _freshness(row: Any, stored: dict[str, Any], now: float | None) -> dict[str, Any]:
    """observed_at, source_time, age_seconds and stale of a succeeded operation.

    `observed_at` is the row's `finished_at`: the completing CAS wrote it from the
    database clock in the statement that recorded the result. Ages are measured on
    that clock too, never on this process's. A result stored before max ages existed
    has no `max_age_seconds` and is never called stale.
    """
    observed_at = row.finished_at
    if observed_at is None:
        return {}
    freshness: dict[str, Any] = {
        "observed_at": observed_at, "source_time": stored.get("source_time"),
    }
    if now is not None:
        age = max(0.0, now - observed_at)
        max_age = stored.get("max_age_seconds")
        freshness |= {"age_seconds": age, "stale": max_age is not None and age > max_age}
    return freshness


def _scope(who: ServerContext | str, request_id: str | None) -> tuple[str, str]:
    if isinstance(who, ServerContext):
        return who.tenant, request_id if request_id is not None else who.request_id
    if request_id is None:
        raise TypeError("results for a tenant need the request id")
    return who, request_id


def results(
    session: Session | Connection | Engine, who: ServerContext | str, request_id: str | None = None
) -> list[CallStatus]:
    """Exactly one status per proposed call of the request, in proposal order (I6).

    Only within the caller's tenant: `who` is the server context (its request by
    default) or the tenant; another tenant's request of the same id is not seen.
    """
    tenant, request = _scope(who, request_id)
    with store_errors():
        if isinstance(session, Engine):
            with read_only(session).connect() as conn:
                return results(conn, tenant, request)
        conn = connection_of(session)
        rows = conn.execute(
            select(calls_table)
            .where(calls_table.c.tenant == tenant, calls_table.c.request_id == request)
            .order_by(calls_table.c.position)
        ).all()
        return call_statuses(conn, rows)


def call_statuses(conn: Connection, rows: Sequence[Any]) -> list[CallStatus]:
    """The caller-facing status of each call row (stored result, or its operation's)."""
    ops = store.operations_in(conn, [r.operation_id for r in rows if r.operation_id and not r.result])
    approval_ids: dict[str, str] = {}
    if ops:
        approval_ids = {
            operation_id: approval_id
            for operation_id, approval_id in conn.execute(
                select(approvals.c.operation_id, approvals.c.approval_id).where(
                    approvals.c.operation_id.in_(list(ops))
                )
            ).all()
        }
    now = store.read_now(conn) if ops else None
    statuses: list[CallStatus] = []
    for r in rows:
        if r.result:
            statuses.append(parse_status(json.loads(r.result)))
            continue
        op = ops[r.operation_id]
        status = operation_status(r.call_id, r.tool_name, op, now=now)
        if isinstance(status, Pending) and status.state == State.PENDING_APPROVAL.value:
            status = status.model_copy(update={"approval_id": approval_ids.get(op.operation_id)})
        if r.reused_from_call_id is not None:
            # A repeat answered from an earlier call: its outcome, or, once that one
            # failed, the repeat's own code.
            status = (
                repeated_failure(r.call_id, r.tool_name, op, operation_id=op.operation_id)
                if isinstance(status, FailedTerminal)
                else status.model_copy(update={"reused_from_call_id": r.reused_from_call_id})
            )
        statuses.append(status)
    return statuses


def parse_status(data: dict[str, Any]) -> CallStatus:
    from pydantic import TypeAdapter

    status: CallStatus = TypeAdapter(CallStatus).validate_python(data)
    return status


def settled(status: CallStatus) -> bool:
    """Nothing will change this status without a person (or it is terminal)."""
    return not isinstance(status, Pending) or status.state in (
        State.RECONCILIATION_PENDING.value,
        State.PENDING_APPROVAL.value,
    )


def final(status: CallStatus) -> Succeeded | FailedRetryable | FailedTerminal:
    """What to tell a model whose turn must end now: a pending call becomes a failure
    with the code that says why (`approval_required`, `reconciliation_pending`, …).
    The operation's real outcome stays readable by operation id once decided."""
    if not isinstance(status, Pending):
        return status
    if status.state == State.PENDING_APPROVAL.value:
        code, message = ErrorCode.APPROVAL_REQUIRED, "waiting for a person to approve"
    elif status.state == State.RECONCILIATION_PENDING.value:
        code, message = ErrorCode.RECONCILIATION_PENDING, "outcome unknown; a person will check it"
    else:
        return FailedRetryable(
            call_id=status.call_id, tool_name=status.tool_name, operation_id=status.operation_id,
            error=ToolError(code=ErrorCode.OPERATION_IN_PROGRESS, message="still running"),
        )
    return FailedTerminal(
        call_id=status.call_id, tool_name=status.tool_name, operation_id=status.operation_id,
        error=ToolError(code=code, message=message),
    )


def wait_for_results(
    engine: Engine,
    who: ServerContext | str,
    request_id: str | None = None,
    *,
    timeout: float,
    poll_seconds: float = 0.05,
) -> list[CallStatus]:
    """Poll until every call of the request is settled, or `timeout` passes."""
    tenant, request = _scope(who, request_id)
    deadline = time.monotonic() + timeout
    while True:
        statuses = results(engine, tenant, request)
        if all(settled(s) for s in statuses) or time.monotonic() >= deadline:
            return statuses
        time.sleep(poll_seconds)


def request_exists(conn: Connection, tenant: str, request_id: str) -> bool:
    query = (
        select(calls_table.c.call_id)
        .where(calls_table.c.tenant == tenant, calls_table.c.request_id == request_id)
        .limit(1)
    )
    return conn.execute(query).first() is not None


def repeated_failure(
    call_id: str, tool_name: str, earlier: Any, *, operation_id: str | None
) -> FailedTerminal:
    """A repeat of a write that failed: `repeated_failed_call`, citing the earlier call's code."""
    return FailedTerminal(
        call_id=call_id, tool_name=tool_name, operation_id=operation_id,
        reused_from_call_id=earlier.call_id,
        error=ToolError(
            code=ErrorCode.REPEATED_FAILED_CALL,
            message="an identical earlier call failed; it is not run again",
            details=(ErrorDetail(path="", code=earlier.error_code or ErrorCode.EXECUTION_FAILED.value),),
        ),
    )


__all__ = [
    "call_statuses",
    "connection_of",
    "final",
    "operation_status",
    "parse_status",
    "repeated_failure",
    "request_exists",
    "results",
    "settled",
    "wait_for_results",
]
