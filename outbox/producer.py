"""The producer API: admit proposed calls and write them in the caller's own transaction.

`enqueue` never talks to the broker. It writes the admitted operations and their
outbox rows through the caller's SQLAlchemy connection, so a business transaction
that rolls back enqueues nothing, and one that commits cannot lose its calls.

Hosted calls (the ones a provider ran itself) are recorded here with the request's
proposals, and `hosted_approval_responses` answers the hosted approvals toolfence
decided, for the next `enqueue(hosted=...)`. What became of the calls is read
through `outbox.results` (`results`, `final`, `settled`, `wait_for_results`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from executor import store
from executor.core.admission import (
    AdmissionUnavailable,
    Admitted,
    Gate,
    Limits,
    Prepared,
    Rejected,
    admit,
    prepare_proposal,
)
from executor.core.budgets import Budgets, Exceeded, Scope
from executor.core.budgets import exceeded as budget_exceeded
from executor.core.budgets import refusal as budget_refusal
from executor.core.identifiers import (
    MAX_IDENTIFIER_CHARS,
    IdentifierField,
    check_server_context,
    default_operation_id,
    identifier_problem,
    storable_key,
)
from executor.core.sanitize import sanitize_error_text
from executor.core.states import TERMINAL, ApprovalState, State
from executor.core.tools import Mode, Registry
from executor.core.types import (
    CallStatus,
    ErrorCode,
    ErrorDetail,
    FailedRetryable,
    FailedTerminal,
    Pending,
    ProposedCall,
    ServerContext,
    Succeeded,
    ToolError,
)
from executor.errors import AdmissionError, ProviderError
from executor.settings import current as current_settings
from executor.store.errors import CONNECTION_ERRORS, bad_data_refusal, store_errors
from executor.telemetry import metrics, tracing
from outbox.handles import CallHandle, EnqueueHandle, HostedCalls
from outbox.hosted_intake import record_hosted
from outbox.results import call_statuses, operation_status, repeated_failure
from outbox.results import connection_of as _connection

NOTIFY_CHANNEL = "toolfence_outbox"


class InvalidBatch(AdmissionError, ValueError):
    """The batch itself is malformed (duplicate or empty call ids): nothing was written."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.request_index: int | None = None  # which request of an `enqueue_many`


def _check_batch(calls: Sequence[ProposedCall]) -> None:
    seen: set[str] = set()
    for call in calls:
        if not call.call_id:
            raise InvalidBatch("empty_call_id", "a proposed call has an empty call id")
        if call.call_id in seen:
            raise InvalidBatch("duplicate_call_id", "two proposed calls share one call id")
        seen.add(call.call_id)


@dataclass
class _Order:
    """Proposal order so far in this batch."""

    write_blocked: bool = False  # an earlier write of this request did not/cannot succeed
    earlier_write_admitted: bool = False  # an earlier write will run first (reads wait for it)
    earlier_call_admitted: bool = False  # an earlier call will run first (writes wait for it)

    def waits(self, is_write: bool) -> bool:
        return self.earlier_call_admitted if is_write else self.earlier_write_admitted

    def admitted(self, is_write: bool) -> None:
        """An operation of this request that will run (or is running) comes before the next call."""
        self.earlier_call_admitted = True
        self.earlier_write_admitted = self.earlier_write_admitted or is_write


def enqueue(
    session: Session | Connection,
    calls: Sequence[ProposedCall],
    context: ServerContext,
    registry: Registry,
    *,
    operation_ids: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    budgets: Budgets | None = None,
    hosted: HostedCalls | None = None,
) -> EnqueueHandle:
    """Admit `calls` and write operations + outbox rows in the caller's transaction.

    Rejected calls get their terminal result at once and no outbox row. Writes run
    in proposal order: once a write of this request cannot succeed (rejected,
    conflicting, already failed), every later write ends `predecessor_failed`.

    A call over its request's or conversation's budget ends `call_budget_exceeded`
    before any gate runs. A write whose intent repeats an earlier write of the
    request or conversation is not run again (unless its tool is `repeatable`): it
    is answered from that call's operation (`reused_from_call_id`), or, if that
    one failed, `repeated_failed_call`. Enqueueing a request again is idempotent:
    a call id already recorded returns its stored status when the call is the
    same, `idempotency_conflict` when it is not, and writes nothing.

    `hosted`: the calls the provider ran itself, recorded in the same transaction
    (`toolfence_hosted_calls`, never their arguments or output) and counted. One
    the policy does not allow is also a call of the request, after its proposals:
    `failed_terminal` `hosted_call_not_allowed`, call id the provider's item id
    (prefixed `hosted:` when a call of the request already uses that id), so
    `results()` and every surface's `write_results` report it. Its handle is in
    the returned handle's `calls`.

    Identifiers (executor/core/identifiers.py) are checked before anything touches
    the database: a bad tenant, principal, request, conversation or turn id or role
    raises `InvalidIdentifier` before any write, so the caller's transaction and
    its own rows stay as they were; a bad call id, tool name or operation id ends
    that call `failed_terminal` `invalid_identifier` (its row stored under a digest
    of the id, its result carrying the id as written, for correlation).

    A database error is raised as `StoreDatabaseError` (SQLSTATE and class, never the
    statement's parameters: they are arguments and server contexts). A tool's access
    rule, business rule check, approval predicate, resources or impact hook that
    loses its connection (`CONNECTION_ERRORS`) raises `AdmissionUnavailable`: it
    decided nothing, so no answer is recorded for the call (a recorded `permission_denied`
    would be returned for good to every retry of the request); roll back and
    enqueue the request again. A hook whose database refused a value of the call
    (a NUL character, a number out of range: SQLSTATE class 22 or 23) has answered:
    that call alone is refused `invalid_arguments` (detail `refused_by_database`)
    and the others are admitted.
    """
    _check_batch(calls)
    check_server_context(context)
    with store_errors(), tracing.enqueue_span(context.tenant, context.request_id, len(calls)):
        return _enqueue(
            session, calls, context, registry,
            operation_ids=operation_ids, limits=limits, budgets=budgets, hosted=hosted,
        )


@dataclass(frozen=True)
class _Plan:
    """What a request's reads need to know, computed purely before the database is
    asked anything: the intent of each write that may repeat an earlier one, each
    call's operation id."""

    calls: Sequence[ProposedCall]
    context: ServerContext
    fingerprints: list[str]
    prepared: list[Prepared | None]
    chosen_ids: Mapping[str, str]
    hashes: frozenset[str]
    candidate_ids: frozenset[str]


def _plan(
    calls: Sequence[ProposedCall], context: ServerContext, registry: Registry,
    operation_ids: Mapping[str, str] | None, limits: Limits,
) -> _Plan:
    fingerprints: list[str] = []
    prepared: list[Prepared | None] = []
    for call in calls:
        fingerprint, ready = prepare_proposal(call, registry, context, limits)
        fingerprints.append(fingerprint)
        prepared.append(ready)
    chosen_ids = operation_ids or {}
    candidate_ids = frozenset(
        chosen_ids.get(call.call_id) or default_operation_id(context.tenant, context.request_id, call.call_id)
        for call in calls if _invalid_identifier(call, chosen_ids.get(call.call_id)) is None
    )
    hashes = frozenset(
        fp for call, fp in zip(calls, fingerprints, strict=True) if _may_repeat(registry, call)
    )
    return _Plan(calls, context, fingerprints, prepared, chosen_ids, hashes, candidate_ids)


def _write_tools(registry: Registry) -> list[str]:
    return [t.name for t in registry if t.mode is Mode.WRITE]


def _enqueue(
    session: Session | Connection,
    calls: Sequence[ProposedCall],
    context: ServerContext,
    registry: Registry,
    *,
    operation_ids: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    budgets: Budgets | None = None,
    hosted: HostedCalls | None = None,
) -> EnqueueHandle:
    """`enqueue` once its input is checked, inside the store boundary."""
    conn = _connection(session)
    limits = limits or current_settings().limits
    plan = _plan(calls, context, registry, operation_ids, limits)
    reads = store.read_for_admission(
        conn, context.tenant, context.request_id, context.conversation_id,
        hashes=plan.hashes, operation_ids=plan.candidate_ids,
    )
    intake = store.Intake(conn, reads, store.Writes(now=reads.now), _write_tools(registry))
    handles, next_position = _admit_request(intake, plan, registry, limits, budgets)
    if hosted is not None:
        intake.writes.flush(conn)
        handles.extend(record_hosted(conn, context, hosted, next_position, limits))
    if conn.dialect.name == "postgresql":
        # Delivered at commit, and only if the caller commits: wakes the relay early.
        intake.writes.notify()
    intake.writes.flush(conn)
    return EnqueueHandle(context.request_id, tuple(handles))


def _admit_request(
    intake: store.Intake, plan: _Plan, registry: Registry, limits: Limits, budgets: Budgets | None,
) -> tuple[list[CallHandle], int]:
    """Decide each call of one request from its reads (writing nothing yet unless
    the reads cannot answer): its handles, and the position after its last call."""
    conn, context = intake.conn, plan.context
    # The TOOLFENCE_BUDGET_* settings (read once per process) unless the caller passes its own.
    budgets = (budgets or current_settings().budgets).for_tenant(context.tenant)
    chosen_ids = plan.chosen_ids
    existing = intake.reads.calls
    next_position = max((row.position for row in existing.values()), default=-1) + 1
    order = _Order()
    handles: list[CallHandle] = []

    for call, fingerprint, prepared in zip(plan.calls, plan.fingerprints, plan.prepared, strict=True):
        tool = registry.get(call.tool_name)
        is_write = tool is not None and tool.mode is Mode.WRITE
        row = existing.get(storable_key(call.call_id))
        if row is not None:
            handle, ok = _again(conn, call, row, fingerprint, registry)
            handles.append(handle)
            if isinstance(handle.status, Pending) and row.reused_from_call_id is None:
                order.admitted(is_write)
            order.write_blocked = order.write_blocked or (is_write and not ok)
            continue
        position, next_position = next_position, next_position + 1
        record = _Recorder(intake, context, call, position, fingerprint)
        chosen_operation_id = chosen_ids.get(call.call_id)

        invalid = _invalid_identifier(call, chosen_operation_id)
        if invalid is not None:
            metrics.PROPOSALS.labels(_tool_label(call, registry), Gate.IDENTIFIER, "rejected").inc()
            record(operation_id=None, gate=Gate.IDENTIFIER, result=invalid)
            handles.append(CallHandle(call.call_id, call.tool_name, None, invalid))
            order.write_blocked = order.write_blocked or is_write
            continue

        over = _over_budget(intake, call, registry, context, budgets)
        if over is not None:
            refused = budget_refusal(call.call_id, call.tool_name, over)
            label = _tool_label(call, registry)
            metrics.PROPOSALS.labels(label, Gate.BUDGET, "rejected").inc()
            metrics.BUDGET_EXCEEDED.labels(label, over.scope, over.budget).inc()
            record(operation_id=None, gate=Gate.BUDGET, result=refused)
            handles.append(CallHandle(call.call_id, call.tool_name, None, refused))
            order.write_blocked = order.write_blocked or is_write
            continue

        try:
            decision = admit(
                call, registry, context, limits,
                reraise=CONNECTION_ERRORS, refusal_for=bad_data_refusal, prepared=prepared,
            )
        except AdmissionUnavailable as unavailable:
            metrics.PROPOSALS.labels(_tool_label(call, registry), unavailable.gate, "unavailable").inc()
            raise
        if isinstance(decision, Rejected):
            metrics.PROPOSALS.labels(_tool_label(call, registry), decision.gate, "rejected").inc()
            record(operation_id=None, gate=decision.gate, result=decision.result)
            handles.append(CallHandle(call.call_id, call.tool_name, None, decision.result))
            order.write_blocked = order.write_blocked or is_write
            continue
        if is_write and order.write_blocked:
            result = FailedTerminal(
                call_id=call.call_id, tool_name=call.tool_name,
                error=ToolError(
                    code=ErrorCode.PREDECESSOR_FAILED,
                    message="an earlier write of this request did not succeed",
                ),
            )
            metrics.PROPOSALS.labels(call.tool_name, Gate.ORDERING, "rejected").inc()
            record(operation_id=None, gate=Gate.ORDERING, result=result)
            handles.append(CallHandle(call.call_id, call.tool_name, None, result))
            continue
        if is_write and not decision.tool.repeatable:
            earlier = intake.earlier_write(context, decision.intent_hash)
            if earlier is not None:
                handle, ok = _repeat(intake, call, earlier, record)
                handles.append(handle)
                order.write_blocked = order.write_blocked or not ok
                continue
        operation_id = chosen_operation_id or default_operation_id(
            context.tenant, context.request_id, call.call_id
        )
        handle, ok = _register(
            intake, decision, operation_id, position, context, order.waits(is_write), record
        )
        handles.append(handle)
        if handle.operation_id is not None and isinstance(handle.status, Pending):
            order.admitted(is_write)
        if is_write and not ok:
            order.write_blocked = True

    return handles, next_position


def _may_repeat(registry: Registry, call: ProposedCall) -> bool:
    """Is the call a write whose intent may repeat an earlier write's?"""
    tool = registry.get(call.tool_name)
    return tool is not None and tool.mode is Mode.WRITE and not tool.repeatable


class NoApprovalResponse(ProviderError, ValueError):
    """The surface cannot answer an MCP approval request (Anthropic's MCP connector,
    the chat surfaces): there is nothing to send, so nothing is returned."""

    code = "approval_response_unsupported"


_DECIDED = frozenset({ApprovalState.APPROVED, ApprovalState.DENIED, ApprovalState.EXPIRED})


def hosted_approval_responses(
    session: Session | Connection, tenant: str, request_id: str, surface: str
) -> list[dict[str, Any]]:
    """The surface's answer to each decided hosted approval of the request, in request
    order: for OpenAI Responses an `mcp_approval_response` input item (approve=true
    only for one toolfence approved; denied and expired ones approve=false). Pending
    approvals are not answered yet. The same decision always yields the same item,
    and a later `mcp_call` citing it passes `enqueue(hosted=...)` only if approved.
    """
    from executor.providers import openai_responses

    if surface != openai_responses.SURFACE:
        raise NoApprovalResponse(
            f"surface {surface[:40]!r} has no MCP approval response (only "
            f"{openai_responses.SURFACE} pauses a hosted MCP call for approval)"
        )
    conn = _connection(session)
    items: list[dict[str, Any]] = []
    for approval in store.hosted_approvals_of_request(conn, tenant, request_id):
        if approval.state not in _DECIDED or approval.surface != surface:
            continue
        approved = approval.state is ApprovalState.APPROVED
        reason = None
        if approval.state is ApprovalState.EXPIRED:
            reason = "approval expired"
        elif not approved and approval.reason:
            reason = sanitize_error_text(approval.reason, 500)
        items.append(
            openai_responses.write_approval_response(
                approval.approval_request_id, approve=approved, reason=reason
            )
        )
    return items


_IDENTIFIER_EXPECTED = f"printable UTF-8 text of 1..{MAX_IDENTIFIER_CHARS} characters"


def _invalid_identifier(call: ProposedCall, operation_id: str | None) -> FailedTerminal | None:
    """The call's refusal when its call id, tool name or chosen operation id breaks
    the identifier contract: one detail per bad field, naming the field and the
    problem, never quoting the value."""
    fields = [(IdentifierField.CALL_ID, call.call_id), (IdentifierField.TOOL_NAME, call.tool_name)]
    if operation_id is not None:
        fields.append((IdentifierField.OPERATION_ID, operation_id))
    details = tuple(
        ErrorDetail(path=field.value, code=problem.value, expected=_IDENTIFIER_EXPECTED)
        for field, value in fields
        if (problem := identifier_problem(value)) is not None
    )
    if not details:
        return None
    return FailedTerminal(
        call_id=call.call_id, tool_name=call.tool_name,
        error=ToolError(
            code=ErrorCode.INVALID_IDENTIFIER,
            message="the call carries an identifier that is not valid: "
            + ", ".join(detail.path for detail in details),
            details=details,
        ),
    )


def _tool_label(call: ProposedCall, registry: Registry) -> str:
    # Bounded label values: a model-invented tool name is not a label.
    return call.tool_name if call.tool_name in registry else "unknown"


class _Recorder:
    """Writes the call row of one new call (its scope, position and fingerprint)."""

    def __init__(
        self, intake: store.Intake, context: ServerContext, call: ProposedCall, position: int,
        fingerprint: str,
    ) -> None:
        self.intake, self.context, self.call = intake, context, call
        self.position, self.fingerprint = position, fingerprint

    def __call__(
        self,
        *,
        operation_id: str | None,
        gate: Gate | None,
        result: CallStatus | None,
        reused_from_call_id: str | None = None,
    ) -> None:
        tool_name = storable_key(self.call.tool_name)
        self.intake.writes.record_call(
            tenant=self.context.tenant, request_id=self.context.request_id,
            conversation_id=self.context.conversation_id,
            # The id as written when it is storable; a digest of it when not (its
            # result, stored as JSON, still carries the id as written).
            call_id=storable_key(self.call.call_id),
            position=self.position, tool_name=tool_name,
            operation_id=operation_id,
            gate=gate, result=None if result is None else result.model_dump(mode="json"),
            proposal_hash=self.fingerprint, reused_from_call_id=reused_from_call_id,
        )
        self.intake.counted(tool_name, gate, result is not None)


def _over_budget(
    intake: store.Intake, call: ProposedCall, registry: Registry, context: ServerContext, budgets: Budgets
) -> Exceeded | None:
    """Would this call break its request's or its conversation's budget? Counted from
    what the scopes held when they were locked (see `lock_scopes`) and the calls this
    batch has recorded since, as the calls table would count them."""
    tool = registry.get(call.tool_name)
    is_write = tool is not None and tool.mode is Mode.WRITE
    tool_budget = tool.budget if tool is not None else None
    scopes = [Scope.REQUEST] if context.conversation_id is None else [Scope.REQUEST, Scope.CONVERSATION]
    for scope in scopes:
        usage = intake.usage(scope, call.tool_name)
        tool_limit = None
        if tool_budget is not None:
            tool_limit = tool_budget.per_request if scope is Scope.REQUEST else tool_budget.per_conversation
        over = budget_exceeded(scope, budgets.limits(scope), usage, is_write=is_write, tool_limit=tool_limit)
        if over is not None:
            return over
    return None


def _again(
    conn: Connection, call: ProposedCall, row: Any, fingerprint: str, registry: Registry
) -> tuple[CallHandle, bool]:
    """A call id this request already recorded: its stored status, or a conflict.

    Nothing is written either way. Rows from before migration 0003 have no
    fingerprint: an admitted one is compared by its operation's intent hash, a
    rejected one is taken as the same call.
    """
    label = _tool_label(call, registry)
    known = row.proposal_hash
    if known is None and row.operation_id is not None and row.reused_from_call_id is None:
        op = store.get_operation(conn, row.operation_id)
        known = None if op is None else op.intent_hash
    if known is not None and known != fingerprint:
        metrics.IDEMPOTENCY.labels(label, "conflict").inc()
        metrics.PROPOSALS.labels(label, Gate.REGISTRATION, "conflict").inc()
        conflict = FailedTerminal(
            call_id=call.call_id, tool_name=call.tool_name,
            error=ToolError(
                code=ErrorCode.IDEMPOTENCY_CONFLICT,
                message="this call id of this request was already used for a different call",
            ),
        )
        return CallHandle(call.call_id, call.tool_name, None, conflict), False
    metrics.IDEMPOTENCY.labels(label, "re_enqueued").inc()
    [status] = call_statuses(conn, [row])
    return CallHandle(call.call_id, row.tool_name, row.operation_id, status), _may_follow(status)


def _may_follow(status: CallStatus) -> bool:
    """May a later write of the request still run after this one?"""
    if isinstance(status, Succeeded):
        return True
    return isinstance(status, Pending) and status.state != State.RECONCILIATION_PENDING.value


def _repeat(
    intake: store.Intake, call: ProposedCall, earlier: store.OperationRow, record: _Recorder
) -> tuple[CallHandle, bool]:
    """A write repeating `earlier` (same intent, same request or conversation): not run again."""
    if earlier.state == State.FAILED_TERMINAL.value:
        metrics.REPEATED_PROPOSALS.labels(earlier.tool_name, "failed").inc()
        metrics.PROPOSALS.labels(earlier.tool_name, Gate.REPEAT, "rejected").inc()
        failed = repeated_failure(call.call_id, call.tool_name, earlier, operation_id=None)
        record(operation_id=None, gate=Gate.REPEAT, result=failed, reused_from_call_id=earlier.call_id)
        return CallHandle(call.call_id, call.tool_name, None, failed), False
    metrics.REPEATED_PROPOSALS.labels(earlier.tool_name, "reused").inc()
    metrics.PROPOSALS.labels(earlier.tool_name, Gate.REPEAT, "reused").inc()
    record(
        operation_id=earlier.operation_id, gate=Gate.REPEAT, result=None,
        reused_from_call_id=earlier.call_id,
    )
    status = operation_status(
        call.call_id, call.tool_name, earlier, now=intake.reads.now
    ).model_copy(update={"reused_from_call_id": earlier.call_id})
    if isinstance(status, Pending) and status.state == State.PENDING_APPROVAL.value:
        approval = store.approval_for_operation(intake.conn, earlier.operation_id)
        status = status.model_copy(update={"approval_id": approval.approval_id if approval else None})
    return CallHandle(call.call_id, call.tool_name, earlier.operation_id, status), _may_follow(status)


def _register(
    intake: store.Intake,
    admitted: Admitted,
    operation_id: str,
    position: int,
    context: ServerContext,
    waits_for_earlier: bool,
    record: _Recorder,
) -> tuple[CallHandle, bool]:
    """Register one admitted call. Returns its handle and whether a write may follow it."""
    call, tool = admitted.call, admitted.tool
    conn = intake.conn
    outcome = _registered(
        intake,
        store.NewOperation(
            operation_id=operation_id,
            request_id=context.request_id,
            call_id=call.call_id,
            position=position,
            tool_name=tool.name,
            schema_version=tool.schema_version,
            mode=tool.mode,
            intent_hash=admitted.intent_hash,
            arguments=admitted.arguments_json,
            context=context.to_json(),
            needs_approval=admitted.needs_approval,
            impact=admitted.impact,
            approval_ttl_seconds=tool.approval.ttl_seconds,
            approved_resources=admitted.approved_resources,
            tenant=context.tenant,
            conversation_id=context.conversation_id,
            trace_context=tracing.stored_context(),
        ),
    )

    status: CallStatus
    if isinstance(outcome, store.Created):
        record(operation_id=operation_id, gate=None, result=None)
        if outcome.state is State.QUEUED and not waits_for_earlier:
            # A call that waits for an earlier one gets its message when that one settles.
            intake.writes.add_outbox_row(operation_id)
        decision = "pending_approval" if outcome.state is State.PENDING_APPROVAL else "admitted"
        metrics.PROPOSALS.labels(tool.name, Gate.REGISTRATION, decision).inc()
        status = Pending(
            call_id=call.call_id, tool_name=call.tool_name, operation_id=operation_id,
            state=outcome.state.value, impact=admitted.impact if admitted.needs_approval else None,
            approval_id=outcome.approval_id,
        )
        return CallHandle(call.call_id, call.tool_name, operation_id, status), True
    if isinstance(outcome, store.Reused):
        metrics.IDEMPOTENCY.labels(tool.name, "reused").inc()
        metrics.PROPOSALS.labels(tool.name, Gate.REGISTRATION, "reused").inc()
        record(operation_id=operation_id, gate=Gate.REGISTRATION, result=None)
        row = intake.reads.operations.get(operation_id) or store.get_operation(conn, operation_id)
        assert row is not None
        status = operation_status(call.call_id, call.tool_name, row, now=intake.reads.now)
        return CallHandle(call.call_id, call.tool_name, operation_id, status), (
            outcome.state is State.SUCCEEDED
        )
    if isinstance(outcome, store.InProgress):
        metrics.IDEMPOTENCY.labels(tool.name, "in_progress").inc()
        metrics.PROPOSALS.labels(tool.name, Gate.REGISTRATION, "in_progress").inc()
        result: CallStatus = FailedRetryable(
            call_id=call.call_id, tool_name=call.tool_name, operation_id=operation_id,
            error=ToolError(
                code=ErrorCode.OPERATION_IN_PROGRESS,
                message="this operation is already running; ask for its result later",
            ),
        )
    else:
        metrics.IDEMPOTENCY.labels(tool.name, "conflict").inc()
        metrics.PROPOSALS.labels(tool.name, Gate.REGISTRATION, "conflict").inc()
        result = FailedTerminal(
            call_id=call.call_id, tool_name=call.tool_name,
            error=ToolError(
                code=ErrorCode.IDEMPOTENCY_CONFLICT,
                message="this operation id was already used for a different call",
            ),
        )
    record(operation_id=None, gate=Gate.REGISTRATION, result=result)
    return CallHandle(call.call_id, call.tool_name, None, result), False


def _registered(intake: store.Intake, new: store.NewOperation) -> store.RegisterOutcome:
    """Register `new`: decided from the reads when they found its id free or taken (the
    INSERT then waits in `intake.writes`), else by `store.register` at once."""
    found = intake.existing(new.operation_id)
    if found is True:
        outcome = store.register(intake.conn, new)
    elif found is None:
        state, approval_id = intake.writes.register(new, intake.postgresql)
        outcome = store.Created(new.operation_id, state, approval_id)
    else:
        assert isinstance(found, store.OperationRow)
        if found.intent_hash != new.intent_hash:
            outcome = store.Conflict(new.operation_id)
        elif State(found.state) in TERMINAL:
            outcome = store.Reused(new.operation_id, State(found.state))
        else:
            outcome = store.InProgress(new.operation_id, State(found.state))
    if isinstance(outcome, store.Created):
        intake.note_registered(new)
    return outcome


__all__ = [
    "AdmissionUnavailable",
    "CallHandle",
    "EnqueueHandle",
    "HostedCalls",
    "InvalidBatch",
    "NoApprovalResponse",
    "default_operation_id",
    "enqueue",
    "hosted_approval_responses",
]
