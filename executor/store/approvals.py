"""Approvals: single-use decisions bound to the intent hash they were requested for.

`approve` and `deny` take the approver as a `ServerContext` and the registry, and
ask `approver_refusal` (executor/core/approvers.py) before deciding, in the same
transaction: every path that decides an approval (CLI, demo, an API) goes through
this check. A refused approver changes nothing but the audit trail.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    insert,
    select,
    update,
)

from executor.core.approvers import (
    ApprovalDecision,
    ApprovalSubject,
    ApproverPolicy,
    ApproverRefusal,
    approver_refusal,
)
from executor.core.identifiers import IdentifierField, check_identifier, identifier_problem
from executor.core.states import ApprovalState, State
from executor.core.surfaces import approvers_for
from executor.core.tools import Registry, RoleResolutionFailed
from executor.core.types import ErrorCode, ServerContext
from executor.store.audit import dumps
from executor.store.cas_sql import NOW
from executor.store.clock import DATABASE_CLOCK, Clock
from executor.store.errors import CONNECTION_ERRORS, refused_for_bad_data
from executor.store.operations import _transition, intent_is
from executor.store.ordering import sql_literal
from executor.store.records import (
    ApprovalRecord,
    Decision,
    DecisionOutcome,
    HostedApprovalRecord,
    StoreError,
)
from executor.store.schema import approvals, hosted_approval_events, hosted_approvals, operations


def get_approval(conn: Connection, approval_id: str) -> ApprovalRecord | None:
    row = conn.execute(select(approvals).where(approvals.c.approval_id == approval_id)).one_or_none()
    if row is None:
        return None
    return ApprovalRecord(
        row.approval_id, row.operation_id, row.intent_hash, json.loads(row.impact),
        ApprovalState(row.state), row.requested_at, row.expires_at,
    )


def approval_for_operation(conn: Connection, operation_id: str) -> ApprovalRecord | None:
    approval_id = conn.execute(
        select(approvals.c.approval_id).where(approvals.c.operation_id == operation_id)
    ).scalar_one_or_none()
    return None if approval_id is None else get_approval(conn, approval_id)


def _decide(
    conn: Connection,
    approval_id: str,
    *fence: ColumnElement[bool],
    decision: ApprovalState,
    approver: str,
    reason: str | None = None,
    clock: Clock,
) -> Row[Any] | None:
    """The approval row's CAS: `pending` → `decision`, once. Returns the operation id
    and intent hash it was requested for, or None when it was no longer pending."""
    now = clock.now()
    return conn.execute(
        update(approvals)
        .where(
            approvals.c.approval_id == approval_id,
            approvals.c.state == ApprovalState.PENDING.value,
            *fence,
        )
        .values(state=decision.value, decided_at=now, decided_by=approver, reason=reason)
        .returning(approvals.c.operation_id, approvals.c.intent_hash)
    ).one_or_none()


class ApproverUnavailable(StoreError):
    """The approver's current roles (the registry's resolver) or the approver
    policy's rule lost its connection (`CONNECTION_ERRORS`): nothing was decided
    and nothing audited, the approval stays pending, and the approver may try
    again. Carries the exception's class, never its text."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"the approver's roles or policy could not be checked ({kind})")
        self.kind = kind


def _judge(
    approver: ServerContext,
    registry: Registry | None,
    policy: Callable[[], ApproverPolicy | None],
    subject: ApprovalSubject,
) -> ApproverRefusal | None:
    """The one approver judgement for operations and hosted approvals alike: the
    approver's current roles (the registry's resolver, when there is a registry),
    then `approver_refusal` under the policy. A resolver or policy lookup that
    fails refuses; one that lost its connection raises `ApproverUnavailable`
    instead (it decided nothing: an `approver_not_allowed` would be a false
    audit event and a false answer)."""
    try:
        try:
            current = (
                approver if registry is None
                else registry.current_context(approver, reraise=CONNECTION_ERRORS)
            )
        except RoleResolutionFailed:
            return ApproverRefusal.POLICY_FAILED
        try:
            found = policy()
        except Exception:
            found = None  # no policy: `approver_refusal` refuses
        return approver_refusal(found, current, subject, reraise=CONNECTION_ERRORS)
    except CONNECTION_ERRORS as exc:
        if refused_for_bad_data(exc):
            return ApproverRefusal.POLICY_FAILED  # a value refused is refused on every try
        raise ApproverUnavailable(type(exc).__name__) from None


def _check_approver(
    conn: Connection,
    approval_id: str,
    approver: ServerContext,
    registry: Registry,
    decision: ApprovalDecision,
    clock: Clock,
) -> Decision | None:
    """None when `approver` may decide the pending approval; else what `approve`/`deny`
    return without deciding. A refusal is audited on the operation (actor: the
    approver's principal, decision `approver_not_allowed`) and leaves it pending.
    Raises `ApproverUnavailable` (having written nothing) when the check lost its
    connection."""
    fence = [approvals.c.approval_id == approval_id, approvals.c.state == ApprovalState.PENDING.value]
    if decision is ApprovalDecision.APPROVE:
        fence.append(approvals.c.expires_at > clock.now())
    row = conn.execute(
        select(
            approvals.c.operation_id, operations.c.tool_name, operations.c.context,
            operations.c.arguments, approvals.c.impact,
        )
        .join(operations, operations.c.operation_id == approvals.c.operation_id)
        .where(*fence, operations.c.state == State.PENDING_APPROVAL.value)
    ).one_or_none()
    if row is None:
        return Decision(DecisionOutcome.NOT_PENDING)
    tool = registry.get(row.tool_name)
    requester = ServerContext.from_json(json.loads(row.context))
    subject = ApprovalSubject(
        operation_id=row.operation_id,
        tool_name=row.tool_name,
        requester=requester,
        arguments=json.loads(row.arguments),
        impact=json.loads(row.impact),
        decision=decision,
    )
    # The tool's approvers, else (a card of a turn surface) the surface's.
    refusal = _judge(approver, registry, lambda: approvers_for(registry, tool, requester), subject)
    if refusal is None:
        return None
    refuse_approver(conn, row.operation_id, actor=approver.principal, clock=clock)
    return Decision(DecisionOutcome.APPROVER_NOT_ALLOWED, row.tool_name, refusal)


def refuse_approver(
    conn: Connection, operation_id: str, *, actor: str, clock: Clock = DATABASE_CLOCK
) -> bool:
    """pending_approval → pending_approval: not a change of state, the audit event of
    an approver the policy refused (`approver_not_allowed`, with who tried)."""
    row = _transition(
        conn, operation_id, State.PENDING_APPROVAL, State.PENDING_APPROVAL,
        values={}, decision=ErrorCode.APPROVER_NOT_ALLOWED.value, clock=clock, actor=actor,
    )
    return row is not None


def _tool_name(conn: Connection, operation_id: str) -> str | None:
    return conn.execute(
        select(operations.c.tool_name).where(operations.c.operation_id == operation_id)
    ).scalar_one_or_none()


def approve(
    conn: Connection,
    approval_id: str,
    *,
    approver: ServerContext,
    registry: Registry,
    clock: Clock = DATABASE_CLOCK,
) -> Decision:
    """pending_approval → queued (with an outbox row), when the tool's approver policy
    allows `approver`. Single use: the approval row's CAS on `pending`.

    The approval stays bound to the intent hash it was requested for; the worker
    refuses with `approval_invalidated` if the intent computed at run time differs.
    """
    refused = _check_approver(conn, approval_id, approver, registry, ApprovalDecision.APPROVE, clock)
    if refused is not None:
        return refused
    decided = _decide(
        conn, approval_id, approvals.c.expires_at > clock.now(),
        decision=ApprovalState.APPROVED, approver=approver.principal, clock=clock,
    )
    if decided is None:
        return Decision(DecisionOutcome.NOT_PENDING)
    row = _transition(
        conn, decided.operation_id, State.PENDING_APPROVAL, State.QUEUED,
        intent_is(decided.intent_hash),
        values={"queued_at": NOW, "available_at": NOW},
        decision="approved", clock=clock, actor=approver.principal,
    )
    if row is None:
        raise StoreError(f"approval {approval_id} does not match its operation's intent")
    return Decision(DecisionOutcome.DECIDED, _tool_name(conn, decided.operation_id))


def deny(
    conn: Connection,
    approval_id: str,
    *,
    approver: ServerContext,
    registry: Registry,
    reason: str,
    clock: Clock = DATABASE_CLOCK,
) -> Decision:
    """pending_approval → failed_terminal (`approval_denied`): a person said no. The
    same approver policy as `approve`, except that a requester may withdraw her own call."""
    refused = _check_approver(conn, approval_id, approver, registry, ApprovalDecision.DENY, clock)
    if refused is not None:
        return refused
    decided = _decide(
        conn, approval_id, decision=ApprovalState.DENIED, approver=approver.principal,
        reason=reason, clock=clock,
    )
    if decided is None:
        return Decision(DecisionOutcome.NOT_PENDING)
    _end_unapproved(
        conn, approval_id, decided.operation_id, ErrorCode.APPROVAL_DENIED.value,
        "approval denied", approver.principal, clock,
    )
    return Decision(DecisionOutcome.DECIDED, _tool_name(conn, decided.operation_id))


def expire_approval(
    conn: Connection,
    approval_id: str,
    *,
    approver: str,
    reason: str,
    clock: Clock = DATABASE_CLOCK,
) -> bool:
    """pending_approval (approval past `expires_at`) → failed_terminal (`approval_denied`):
    nobody decided in time. Loses to a decision made before expiry."""
    decided = _decide(
        conn, approval_id, approvals.c.expires_at <= clock.now(),
        decision=ApprovalState.EXPIRED, approver=approver, reason=reason, clock=clock,
    )
    if decided is None:
        return False
    _end_unapproved(
        conn, approval_id, decided.operation_id, "approval_expired", "approval expired",
        approver, clock,
    )
    return True


def _end_unapproved(
    conn: Connection,
    approval_id: str,
    operation_id: str,
    decision: str,
    message: str,
    approver: str,
    clock: Clock,
) -> None:
    """The operation's side of `deny` and `expire_approval`, once the approval's CAS won."""
    row = _transition(
        conn, operation_id, State.PENDING_APPROVAL, State.FAILED_TERMINAL,
        values={
            "error_code": ErrorCode.APPROVAL_DENIED.value,
            "error": dumps({"message": message}),
            "finished_at": NOW,
        },
        decision=decision, clock=clock, actor=approver,
    )
    if row is None:
        raise StoreError(f"approval {approval_id} has no operation waiting for it")


def expired_approvals(conn: Connection, limit: int, clock: Clock = DATABASE_CLOCK) -> list[str]:
    return list(
        conn.execute(
            select(approvals.c.approval_id)
            .where(
                approvals.c.state == sql_literal(ApprovalState.PENDING),  # ix_toolfence_approvals_pending
                approvals.c.expires_at <= clock.now(),
            )
            .limit(limit)
        ).scalars()
    )


# ------------------------------------------------------------------ hosted approvals
#
# An `mcp_approval_request` is a call the provider will run itself once answered:
# there is no operation, so the approval row is the whole state, and its audit trail
# is `toolfence_hosted_approval_events`. The approver check is the same
# `approver_refusal`, with the hosted server's ApproverPolicy.

HOSTED_APPROVAL_PREFIX = "hapr_"
HOSTED_APPROVAL_TOOL = "hosted.mcp_approval_request"
"""The tool name a hosted approval's `Decision` (and its metric label) carries: bounded,
never the provider's label or tool name."""

HostedApproversFor = Callable[[str, str], ApproverPolicy | None]
"""(server label, tool) → the ApproverPolicy deciding it now, None when the current
hosted-tool policy no longer routes that tool to approval (`HostedPolicy.approvers_for`)."""


def hosted_approval_id(tenant: str, approval_request_id: str) -> str:
    """Deterministic per (tenant, provider approval request): recording the same request
    again finds the same row."""
    material = f"{tenant}\0{approval_request_id}".encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(material).hexdigest()
    return f"{HOSTED_APPROVAL_PREFIX}{digest[:32]}"


def _hosted_record(row: Row[Any]) -> HostedApprovalRecord:
    return HostedApprovalRecord(
        row.approval_id, row.tenant, row.request_id, row.approval_request_id, row.surface,
        row.server_label, row.tool_name, row.intent_hash, json.loads(row.impact),
        json.loads(row.context), ApprovalState(row.state), row.requested_at, row.expires_at,
        row.decided_at, row.decided_by, row.reason,
    )


def _hosted_event(
    conn: Connection,
    approval_id: str,
    from_state: ApprovalState | None,
    to_state: ApprovalState,
    decision_code: str,
    actor: str | None,
    clock: Clock,
) -> None:
    conn.execute(
        insert(hosted_approval_events).values(
            approval_id=approval_id, from_state=None if from_state is None else from_state.value,
            to_state=to_state.value, decision_code=decision_code, actor=actor, at=clock.now(),
        )
    )


def record_hosted_approval(
    conn: Connection,
    *,
    tenant: str,
    request_id: str,
    approval_request_id: str,
    surface: str,
    server_label: str,
    tool_name: str,
    intent_hash: str,
    impact: Mapping[str, Any],
    requester: ServerContext,
    ttl_seconds: float,
    clock: Clock = DATABASE_CLOCK,
) -> str:
    """A new pending hosted approval (audited `requested`), or the id of the one already
    recorded for this tenant's `approval_request_id` (unchanged: a provider request is
    decided once, whichever response re-reports it).

    `approval_request_id`, `server_label` and `tool_name` are provider-written and
    go to `String(200)` columns; the id is answered back to the provider verbatim,
    so none is clipped: one that is not an identifier (executor/core/identifiers.py:
    overlong, NUL, lone surrogate, control characters) raises `InvalidIdentifier`
    before anything is written, the caller's transaction untouched.
    `enqueue(hosted=...)` refuses such a request before it gets here."""
    check_identifier(IdentifierField.APPROVAL_REQUEST_ID, approval_request_id)
    check_identifier(IdentifierField.SERVER_LABEL, server_label)
    check_identifier(IdentifierField.TOOL_NAME, tool_name)
    approval_id = hosted_approval_id(tenant, approval_request_id)
    exists = conn.execute(
        select(hosted_approvals.c.approval_id).where(hosted_approvals.c.approval_id == approval_id)
    ).scalar_one_or_none()
    if exists is not None:
        return approval_id
    now = clock.now()
    conn.execute(
        insert(hosted_approvals).values(
            approval_id=approval_id, tenant=tenant, request_id=request_id,
            approval_request_id=approval_request_id, surface=surface, server_label=server_label,
            tool_name=tool_name, intent_hash=intent_hash, impact=dumps(dict(impact)),
            context=dumps(requester.to_json()), state=ApprovalState.PENDING.value,
            requested_at=now, expires_at=now + ttl_seconds,
        )
    )
    _hosted_event(conn, approval_id, None, ApprovalState.PENDING, "requested", requester.principal, clock)
    return approval_id


def get_hosted_approval(conn: Connection, approval_id: str) -> HostedApprovalRecord | None:
    row = conn.execute(
        select(hosted_approvals).where(hosted_approvals.c.approval_id == approval_id)
    ).one_or_none()
    return None if row is None else _hosted_record(row)


def hosted_approvals_of_request(
    conn: Connection, tenant: str, request_id: str
) -> list[HostedApprovalRecord]:
    rows = conn.execute(
        select(hosted_approvals)
        .where(hosted_approvals.c.tenant == tenant, hosted_approvals.c.request_id == request_id)
        .order_by(hosted_approvals.c.requested_at, hosted_approvals.c.approval_id)
    ).all()
    return [_hosted_record(row) for row in rows]


def pending_hosted_approvals(
    conn: Connection, tenant: str | None = None
) -> list[HostedApprovalRecord]:
    """Pending hosted approvals, oldest first: one tenant's, or (`None`) every tenant's."""
    query = (
        select(hosted_approvals)
        .where(hosted_approvals.c.state == sql_literal(ApprovalState.PENDING))  # ix_…_pending
        .order_by(hosted_approvals.c.requested_at, hosted_approvals.c.approval_id)
    )
    if tenant is not None:
        query = query.where(hosted_approvals.c.tenant == tenant)
    rows = conn.execute(query).all()
    return [_hosted_record(row) for row in rows]


def granted_hosted_intents(
    conn: Connection, tenant: str, approval_request_ids: Iterable[str]
) -> dict[str, str]:
    """approval_request_id → intent hash, for this tenant's approved hosted approvals
    among `approval_request_ids` (what `hosted_violations` checks an mcp_call against).
    An id that is not an identifier (provider text: overlong, NUL, a lone surrogate)
    was never recorded, so it is not looked up: the database would refuse it."""
    wanted = sorted({i for i in approval_request_ids if identifier_problem(i) is None})
    if not wanted:
        return {}
    rows = conn.execute(
        select(hosted_approvals.c.approval_request_id, hosted_approvals.c.intent_hash).where(
            hosted_approvals.c.tenant == tenant,
            hosted_approvals.c.approval_request_id.in_(wanted),
            hosted_approvals.c.state == ApprovalState.APPROVED.value,
        )
    ).all()
    return {row.approval_request_id: row.intent_hash for row in rows}


def _decide_hosted(
    conn: Connection,
    approval_id: str,
    *fence: ColumnElement[bool],
    decision: ApprovalState,
    decision_code: str,
    actor: str,
    reason: str | None,
    clock: Clock,
) -> bool:
    """The hosted approval's CAS: `pending` → `decision`, once; audited when it won."""
    won = conn.execute(
        update(hosted_approvals)
        .where(
            hosted_approvals.c.approval_id == approval_id,
            hosted_approvals.c.state == ApprovalState.PENDING.value,
            *fence,
        )
        .values(state=decision.value, decided_at=clock.now(), decided_by=actor, reason=reason)
        .returning(hosted_approvals.c.approval_id)
    ).one_or_none()
    if won is None:
        return False
    _hosted_event(conn, approval_id, ApprovalState.PENDING, decision, decision_code, actor, clock)
    return True


def _check_hosted_approver(
    conn: Connection,
    approval_id: str,
    approver: ServerContext,
    approvers_for: HostedApproversFor,
    registry: Registry | None,
    decision: ApprovalDecision,
    clock: Clock,
) -> Decision | None:
    """As `_check_approver`, for a hosted approval: None when `approver` may decide it.
    A refusal appends `approver_not_allowed` to the hosted audit trail; still pending."""
    fence = [
        hosted_approvals.c.approval_id == approval_id,
        hosted_approvals.c.state == ApprovalState.PENDING.value,
    ]
    if decision is ApprovalDecision.APPROVE:
        fence.append(hosted_approvals.c.expires_at > clock.now())
    row = conn.execute(select(hosted_approvals).where(*fence)).one_or_none()
    if row is None:
        return Decision(DecisionOutcome.NOT_PENDING)
    impact = json.loads(row.impact)
    subject = ApprovalSubject(
        operation_id=row.approval_id,
        tool_name=row.tool_name,
        requester=ServerContext.from_json(json.loads(row.context)),
        arguments=impact,
        impact=impact,
        decision=decision,
        server_label=row.server_label,
    )
    refusal = _judge(
        approver, registry, lambda: approvers_for(row.server_label, row.tool_name), subject
    )
    if refusal is None:
        return None
    _hosted_event(
        conn, approval_id, ApprovalState.PENDING, ApprovalState.PENDING,
        ErrorCode.APPROVER_NOT_ALLOWED.value, approver.principal, clock,
    )
    return Decision(DecisionOutcome.APPROVER_NOT_ALLOWED, HOSTED_APPROVAL_TOOL, refusal)


def approve_hosted(
    conn: Connection,
    approval_id: str,
    *,
    approver: ServerContext,
    approvers_for: HostedApproversFor,
    registry: Registry | None = None,
    clock: Clock = DATABASE_CLOCK,
) -> Decision:
    """pending → approved for a hosted approval, when the server's ApproverPolicy allows
    `approver` (`approver_refusal`, roles resolved through `registry` when given).
    Single use; bound to the intent hash recorded with the request."""
    refused = _check_hosted_approver(
        conn, approval_id, approver, approvers_for, registry, ApprovalDecision.APPROVE, clock
    )
    if refused is not None:
        return refused
    if not _decide_hosted(
        conn, approval_id, hosted_approvals.c.expires_at > clock.now(),
        decision=ApprovalState.APPROVED, decision_code="approved", actor=approver.principal,
        reason=None, clock=clock,
    ):
        return Decision(DecisionOutcome.NOT_PENDING)
    return Decision(DecisionOutcome.DECIDED, HOSTED_APPROVAL_TOOL)


def deny_hosted(
    conn: Connection,
    approval_id: str,
    *,
    approver: ServerContext,
    approvers_for: HostedApproversFor,
    reason: str,
    registry: Registry | None = None,
    clock: Clock = DATABASE_CLOCK,
) -> Decision:
    """pending → denied for a hosted approval: the same check as `approve_hosted`,
    except that the requester may withdraw her own request."""
    refused = _check_hosted_approver(
        conn, approval_id, approver, approvers_for, registry, ApprovalDecision.DENY, clock
    )
    if refused is not None:
        return refused
    if not _decide_hosted(
        conn, approval_id, decision=ApprovalState.DENIED,
        decision_code=ErrorCode.APPROVAL_DENIED.value, actor=approver.principal,
        reason=reason, clock=clock,
    ):
        return Decision(DecisionOutcome.NOT_PENDING)
    return Decision(DecisionOutcome.DECIDED, HOSTED_APPROVAL_TOOL)


def expire_hosted_approval(
    conn: Connection, approval_id: str, *, approver: str, reason: str, clock: Clock = DATABASE_CLOCK
) -> bool:
    """pending (past `expires_at`) → expired: nobody decided in time; answered as a denial."""
    return _decide_hosted(
        conn, approval_id, hosted_approvals.c.expires_at <= clock.now(),
        decision=ApprovalState.EXPIRED, decision_code="approval_expired", actor=approver,
        reason=reason, clock=clock,
    )


def expired_hosted_approvals(
    conn: Connection, limit: int, clock: Clock = DATABASE_CLOCK
) -> list[str]:
    return list(
        conn.execute(
            select(hosted_approvals.c.approval_id)
            .where(
                # ix_toolfence_hosted_approvals_pending: a literal, so a prepared
                # statement's generic plan still matches the partial index (0194)
                hosted_approvals.c.state == sql_literal(ApprovalState.PENDING),
                hosted_approvals.c.expires_at <= clock.now(),
            )
            .limit(limit)
        ).scalars()
    )


def hosted_approval_trail(conn: Connection, approval_id: str) -> list[Row[Any]]:
    """The hosted approval's audit events, oldest first."""
    return list(
        conn.execute(
            select(hosted_approval_events)
            .where(hosted_approval_events.c.approval_id == approval_id)
            .order_by(hosted_approval_events.c.event_id)
        ).all()
    )
