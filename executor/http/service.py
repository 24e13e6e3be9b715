"""What the API and the console do, as plain functions over an Identity.

The routes (executor/http/api.py) and the console's pages
(executor/http/console/) both call these, so an approval decided in a page
and one decided through the API go through the same checks. Every function is
tenant-scoped by the caller's identity: another tenant's id is `not_found`,
exactly like an id that does not exist.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from executor import store
from executor.core.approvers import ApprovalDecision
from executor.core.canonical import NotCanonicalizable, canonical_json
from executor.core.identifiers import InvalidIdentifier, check_server_context, identifier_problem
from executor.core.impact import impact_digest as digest_of
from executor.core.tools import Registry
from executor.core.types import CallStatus, ErrorCode, ProposedCall, ServerContext
from executor.http import cards
from executor.http.keys import Identity
from executor.http.models import (
    ApprovalDecisionOut,
    ApprovalOut,
    AuditEventOut,
    BatchAnswer,
    DecisionOut,
    NeutralBatch,
    OperationOut,
    PendingOut,
    ProviderEnvelope,
    ReceiptOut,
    RequestAnswer,
    RequestBatch,
    RequestCallOut,
    ResolveOut,
    TurnBody,
    TurnOut,
    TurnStarted,
    TurnStepOut,
    call_statuses,
    moment,
)
from executor.http.problems import ProblemDetail, ProblemError
from executor.providers.hosted import NO_HOSTED_TOOLS, HostedPolicy
from executor.settings import Settings
from executor.store import console_reads, operator
from executor.store.api_keys import claim_idempotency_key
from executor.store.engine import read_only
from executor.telemetry import logcontext, metrics
from outbox.batches import QueuedRequest, enqueue_many
from outbox.producer import HostedCalls, InvalidBatch, enqueue
from outbox.results import final, request_exists, results, settled

POLL_SECONDS = 0.05


def storable(value: str, limit: int = 200) -> bool:
    """An id or reference the store can hold (`identifier_problem`: 1 to `limit`
    printable characters, no NUL, no lone surrogate). The API's models check ids
    before a request reaches the service; the console's forms and paths reach it
    unchecked, so every method that takes one from the caller asks this first (a NUL
    would otherwise be refused by PostgreSQL as a `DataError`, a 500)."""
    return identifier_problem(value, limit) is None


def not_found(what: str) -> ProblemError:
    return ProblemError(404, ErrorCode.NOT_FOUND, f"no {what} for this tenant")


def _checked(context: ServerContext) -> ServerContext:
    """The identifier contract (executor/core/identifiers.py) before any database work:
    a conversation id the body pattern let through but the store would refuse (a C1
    control character, say) is the caller's 400, never a 500 from deep in `enqueue`."""
    try:
        check_server_context(context)
    except InvalidIdentifier as exc:
        raise ProblemError(
            400, ErrorCode.INVALID_REQUEST, str(exc),
            errors=[ProblemDetail(path=f"/{exc.field.value}", code=exc.problem.value)],
        ) from None
    return context


@dataclass
class Service:
    settings: Settings
    engine: Engine
    registry: Registry
    hosted_policy: HostedPolicy = NO_HOSTED_TOOLS
    # Set when the server begins to shut down: long-polls answer what they have.
    draining: threading.Event = field(default_factory=threading.Event)

    # ------------------------------------------------------------ requests

    def submit(
        self, who: Identity, body: NeutralBatch | ProviderEnvelope, digest: str, idempotency_key: str | None
    ) -> tuple[RequestAnswer, bool]:
        """Admit and enqueue in one transaction; (answer, replayed). A retried POST with
        the same Idempotency-Key is answered from the request it created. The calls are
        admitted under the key's turn surface, if it has one (`Identity.context`); a
        surface this server does not declare is 503 before anything is written."""
        from executor.providers import SURFACES, AdapterError

        self._require_surface(who.surface, KEY_SURFACE_UNDECLARED)
        hosted: HostedCalls | None = None
        if isinstance(body, ProviderEnvelope):
            adapter = SURFACES[body.provider]
            try:
                calls = adapter.read_proposals(body.response, known_names=self.registry.names())
                hosted = HostedCalls(adapter.read_hosted_calls(body.response), self.hosted_policy)
            except AdapterError as exc:
                raise ProblemError(
                    400, ErrorCode.INVALID_REQUEST, f"the {adapter.name} response was refused",
                    errors=[ProblemDetail(path="/response", code=exc.code.value)],
                ) from None
        else:
            calls = [
                ProposedCall(call_id=c.call_id, tool_name=c.tool_name, arguments=c.arguments)
                for c in body.calls
            ]
        request_id = (
            request_id_for(who, idempotency_key) if idempotency_key else f"req_{uuid.uuid4().hex[:24]}"
        )
        # Run in a worker thread on a copy of the request's context: bound for this call only.
        logcontext.bind(request_id=request_id, tenant=who.tenant)
        context = _checked(who.context(request_id, body.conversation_id))
        with self.engine.begin() as conn:
            if idempotency_key:
                claim = claim_idempotency_key(
                    conn, tenant=who.tenant, principal=who.principal,
                    idempotency_key=idempotency_key, request_id=request_id, body_digest=digest,
                )
                if claim.body_digest != digest:
                    raise ProblemError(
                        409, ErrorCode.IDEMPOTENCY_CONFLICT,
                        "this Idempotency-Key was used with a different body",
                    )
                if not claim.created:
                    statuses = results(conn, who.tenant, claim.request_id)
                    return _answer(claim.request_id, statuses), True
            try:
                handle = enqueue(
                    conn, calls, context, self.registry, budgets=self.settings.budgets, hosted=hosted,
                )
            except InvalidBatch as exc:
                raise ProblemError(
                    400, ErrorCode.INVALID_REQUEST, str(exc),
                    errors=[ProblemDetail(path="/calls", code=exc.code)],
                ) from None
        return _answer(handle.request_id, [c.status for c in handle.calls]), False

    def submit_many(self, who: Identity, body: RequestBatch) -> BatchAnswer:
        """Admit and enqueue every request of the batch in one transaction
        (`enqueue_many`), each under the key's turn surface as `submit` does. A request
        the batch cannot take refuses the whole batch, naming it; nothing is written."""
        self._require_surface(who.surface, KEY_SURFACE_UNDECLARED)
        items: list[QueuedRequest] = []
        for index, item in enumerate(body.requests):
            calls = [
                ProposedCall(call_id=c.call_id, tool_name=c.tool_name, arguments=c.arguments)
                for c in item.calls
            ]
            request_id = (
                request_id_for(who, f"batch\0{item.request_key}") if item.request_key
                else f"req_{uuid.uuid4().hex[:24]}"
            )
            try:
                context = _checked(who.context(request_id, item.conversation_id))
            except ProblemError as exc:
                exc.errors = [e.model_copy(update={"path": f"/requests/{index}{e.path}"}) for e in exc.errors]
                raise
            items.append(QueuedRequest(calls, context))
        logcontext.bind(tenant=who.tenant)
        with self.engine.begin() as conn:
            try:
                handles = enqueue_many(conn, items, self.registry, budgets=self.settings.budgets)
            except InvalidBatch as exc:
                where = "" if exc.code == "duplicate_request" else "/calls"
                raise ProblemError(
                    400, ErrorCode.INVALID_REQUEST, str(exc),
                    errors=[ProblemDetail(path=f"/requests/{exc.request_index}{where}", code=exc.code)],
                ) from None
        return BatchAnswer(requests=[_answer(h.request_id, [c.status for c in h.calls]) for h in handles])

    async def request(
        self, who: Identity, request_id: str, *, provider: str | None, wait: float
    ) -> RequestAnswer:
        """One status per call; with `wait`, long-polled until all are settled. The
        wait itself holds no thread (only each read does), so long-polls are cheap;
        it ends early, with what is known, once the server begins to drain."""
        if not await run_in_threadpool(self._exists, who, request_id):
            raise not_found("request")
        deadline = time.monotonic() + wait
        while True:
            statuses = await run_in_threadpool(results, self.engine, who.tenant, request_id)
            if all(settled(s) for s in statuses) or time.monotonic() >= deadline or self.draining.is_set():
                break
            await asyncio.sleep(POLL_SECONDS)
        answer = _answer(request_id, statuses)
        if provider is None:
            return answer
        from executor.providers import SURFACES, AdapterError

        adapter = SURFACES[provider]
        proposals = [ProposedCall(call_id=s.call_id, tool_name=s.tool_name, arguments="{}") for s in statuses]
        try:
            written = adapter.write_results(proposals, [final(s) for s in statuses])
        except AdapterError as exc:
            raise ProblemError(
                400, ErrorCode.INVALID_REQUEST, f"cannot write these results in the {provider} shape",
                errors=[ProblemDetail(path="provider", code=exc.code.value)],
            ) from None
        return answer.model_copy(update={"provider": provider, "results": written})

    def _exists(self, who: Identity, request_id: str) -> bool:
        with read_only(self.engine).connect() as conn:
            return request_exists(conn, who.tenant, request_id)

    # ------------------------------------------------------------ turns

    def start_turn(
        self, who: Identity, body: TurnBody, digest: str, idempotency_key: str | None
    ) -> tuple[TurnStarted, bool]:
        """Write the turn (and its outbox row) in one transaction; (answer, replayed).
        The driver, scope and when-busy rule are the server's settings, never the
        caller's: a driver named by a caller would be a file the worker reads. So is
        the surface: the key's, else TOOLFENCE_TURN_SURFACE, else none; one the
        registry does not declare is 503 before anything is written."""
        from executor.core.surfaces import UnknownSurface
        from executor.store import turns as turn_store
        from executor.turns.service import TurnInProgress, start_turn
        from executor.turns.values import TurnOptions

        driver = self.settings.turn_driver
        if not driver:
            raise ProblemError(
                503, ErrorCode.TURNS_NOT_CONFIGURED,
                "this server runs no turns: it has no TOOLFENCE_TURN_DRIVER",
            )
        if who.surface is not None:
            self._require_surface(who.surface, KEY_SURFACE_UNDECLARED)
        else:
            self._require_surface(self.settings.turn_surface, SETTING_SURFACE_UNDECLARED)
        surface = who.surface or self.settings.turn_surface
        turn_id = turn_id_for(who, idempotency_key) if idempotency_key else turn_store.new_turn_id()
        context = _checked(who.context(turn_id, body.conversation_id))
        try:
            with self.engine.begin() as conn:
                if idempotency_key:
                    claim = claim_idempotency_key(
                        conn, tenant=who.tenant, principal=who.principal,
                        idempotency_key=idempotency_key, request_id=turn_id, body_digest=digest,
                    )
                    if claim.body_digest != digest:
                        raise ProblemError(
                            409, ErrorCode.IDEMPOTENCY_CONFLICT,
                            "this Idempotency-Key was used with a different body",
                        )
                    if not claim.created:
                        row = turn_store.get_turn(conn, claim.request_id)
                        assert row is not None and row.tenant == who.tenant
                        return TurnStarted(turn_id=row.turn_id, state=row.state), True
                handle = start_turn(
                    conn, context, body.conversation_id, body.message, driver=driver,
                    options=TurnOptions(max_steps=self.settings.turn_max_steps),
                    scope=self.settings.turn_scope, when_busy=self.settings.turn_when_busy,
                    turn_id=turn_id, surface=surface, registry=self.registry,
                )
        except UnknownSurface:
            # Checked above; kept so that a registry changed in between still answers
            # the same problem (start_turn raised before writing anything).
            raise _surface_problem(
                KEY_SURFACE_UNDECLARED if who.surface else SETTING_SURFACE_UNDECLARED
            ) from None
        except TurnInProgress as exc:
            # The transaction rolled back: neither the turn nor the key's claim was written.
            raise ProblemError(
                409, ErrorCode.TURN_IN_PROGRESS, f"a turn of this {exc.scope} is already running",
            ) from None
        return TurnStarted(turn_id=handle.turn_id, state=handle.state), False  # type: ignore[arg-type]

    def _require_surface(self, name: str | None, message: str) -> None:
        """A named turn surface this server's registry does not declare (a key made for
        another deployment, or a surface removed since) refuses the work before
        anything is written (decision 0208). Admission alone would fail closed too,
        but as `tool_not_allowed` for every call: the caller's mistake in its words,
        when the fix is the operator's."""
        if name is not None and self.registry.surface(name) is None:
            raise _surface_problem(message)

    async def turn(self, who: Identity, turn_id: str, *, wait: float) -> TurnOut:
        """The turn from `get_turn`; with `wait`, long-polled until it has ended (a
        cheap state read per poll, no thread held while waiting)."""
        from executor.core.states import TURN_ENDED, TurnState

        deadline = time.monotonic() + wait
        while True:
            state = await run_in_threadpool(self._turn_state, who, turn_id)
            if state is None:
                raise not_found("turn")
            if TurnState(state) in TURN_ENDED or time.monotonic() >= deadline or self.draining.is_set():
                break
            await asyncio.sleep(POLL_SECONDS * 4)
        view = await run_in_threadpool(self._turn_view, who, turn_id)
        if view is None:
            raise not_found("turn")
        return view

    def _turn_state(self, who: Identity, turn_id: str) -> str | None:
        from executor.store import turns as turn_store

        with read_only(self.engine).connect() as conn:
            row = turn_store.get_turn(conn, turn_id)
        return row.state if row is not None and row.tenant == who.tenant else None

    def _turn_view(self, who: Identity, turn_id: str) -> TurnOut | None:
        from executor.core.states import TURN_ENDED, TurnState
        from executor.turns.service import get_turn

        view = get_turn(self.engine, who.tenant, turn_id)
        if view is None:
            return None
        return TurnOut(
            turn_id=view["turn_id"], conversation_id=view["conversation_id"],
            principal=view["principal"], state=view["state"],
            terminal=TurnState(view["state"]) in TURN_ENDED, end_reason=view["end_reason"],
            final_output=view["final_output"], error=view["error"], surface=view["surface"],
            generation=view["generation"], steps=[TurnStepOut.model_validate(step) for step in view["steps"]],
            created_at=view["created_at"], finished_at=view["finished_at"],
        )

    # ------------------------------------------------------------ approvals

    def approvals(self, who: Identity) -> list[ApprovalOut]:
        """The tenant's pending approvals, each impact recomputed now on current state
        (with its digest, the tool's amount hints, and the other pending and in-flight
        operations on the same resources: executor/http/cards.py)."""
        with read_only(self.engine).connect() as conn:
            rows = operator.pending_approvals(conn, tenant=who.tenant)
            hosted = store.pending_hosted_approvals(conn, tenant=who.tenant)
            now = store.read_now(conn)
            resources = {r.operation_id: self._resources(r) for r in rows}
            related = cards.related_operations(conn, self.registry, who.tenant, resources.items())
        found: list[ApprovalOut] = []
        for r in rows:
            impact, digest = cards.card_impact(self.registry, r)
            shown, sharing = related.get(r.operation_id, ([], 0))
            found.append(ApprovalOut(
                approval_id=r.approval_id, kind="operation", operation_id=r.operation_id,
                request_id=r.request_id, call_id=r.call_id, tool=r.tool_name, requester=r.requester,
                impact=impact, impact_digest=digest, impact_as_of=moment(now),
                impact_current=digest is not None, amounts=cards.amounts_of(self.registry, r.tool_name),
                related=shown, related_count=sharing, resources=resources[r.operation_id],
                intent_hash=r.intent_hash, requested_at=moment(r.requested_at),
                expires_at=moment(r.expires_at),
                age_seconds=r.age_seconds,
            ))
        found += [
            ApprovalOut(
                approval_id=h.approval_id, kind="hosted", operation_id=None, request_id=h.request_id,
                call_id=None, tool=store.HOSTED_APPROVAL_TOOL,
                requester=str(h.requester.get("principal", "")), impact=h.impact,
                # A hosted call's impact is the redacted summary of the provider's
                # arguments: fixed when it was asked, so its digest is the stored one's.
                impact_digest=digest_of(h.impact), impact_as_of=moment(now),
                impact_current=True, amounts={}, related=[], related_count=0, resources=None,
                intent_hash=h.intent_hash, requested_at=moment(h.requested_at),
                expires_at=moment(h.expires_at),
                age_seconds=max(0.0, now - h.requested_at),
            )
            for h in hosted
        ]
        return found

    def _resources(self, approval: operator.PendingApproval) -> list[str] | None:
        """What the call will touch: the approved set of a write declaring `resources`,
        else the tool's canonical resource ids (those its intent hash binds)."""
        if approval.resources is not None:
            return approval.resources
        tool = self.registry.get(approval.tool_name)
        if tool is None or tool.resource_ids is None:
            return None
        try:
            args = tool.input_model.model_validate(approval.arguments)
            context = ServerContext.from_json(approval.context)
            return sorted(set(tool.resource_ids(args, context)))
        except Exception:
            return None  # a tool changed since admission: show none rather than guess

    def _decide(
        self, who: Identity, approval_id: str, verb: ApprovalDecision, reason: str | None,
        shown_digest: str | None,
    ) -> tuple[store.Decision, str | None, str | None]:
        if not storable(approval_id):
            raise not_found("approval")
        approver = who.context("http-approval")
        hosted = approval_id.startswith(store.HOSTED_APPROVAL_PREFIX)
        operation_id: str | None = None
        decided_digest: str | None = None
        with self.engine.begin() as conn:
            if hosted:
                record = store.get_hosted_approval(conn, approval_id)
                if record is None or record.tenant != who.tenant:
                    raise not_found("approval")
                approvers_for = self.hosted_policy.approvers_for
                if verb is ApprovalDecision.APPROVE:
                    decided_digest = digest_of(record.impact)
                    if shown_digest is not None and shown_digest != decided_digest:
                        raise ProblemError(
                            409, ErrorCode.IMPACT_CHANGED, "the impact is not the one shown",
                            errors=[ProblemDetail(path="/impact_digest", code="stale")],
                        )
                    decision = store.approve_hosted(
                        conn, approval_id, approver=approver, approvers_for=approvers_for,
                        registry=self.registry,
                    )
                else:
                    decision = store.deny_hosted(
                        conn, approval_id, approver=approver, approvers_for=approvers_for,
                        registry=self.registry, reason=reason or "denied",
                    )
            else:
                if operator.approval_tenant(conn, approval_id) != who.tenant:
                    raise not_found("approval")
                approval = store.get_approval(conn, approval_id)
                assert approval is not None
                operation_id = approval.operation_id
                if verb is ApprovalDecision.APPROVE:
                    found = operator.pending_approvals(conn, who.tenant, approval_id)
                    if not found:
                        return store.Decision(store.DecisionOutcome.NOT_PENDING), operation_id, None
                    pending = found[0]
                    # Recomputed in the deciding transaction (decision 0222).
                    impact, decided_digest = cards.check_decided_impact(
                        self.registry, pending, shown_digest
                    )
                    decision = store.approve(conn, approval_id, approver=approver, registry=self.registry)
                    if decision.outcome is store.DecisionOutcome.DECIDED:
                        cards.record_decided_impact(conn, approval_id, impact)
                else:
                    decision = store.deny(
                        conn, approval_id, approver=approver, registry=self.registry,
                        reason=reason or "denied",
                    )
        return decision, operation_id, decided_digest

    def decide(
        self, who: Identity, approval_id: str, verb: ApprovalDecision, reason: str | None,
        impact_digest: str | None = None,
    ) -> DecisionOut:
        """approve or deny as the key's principal, through the store's approver check;
        a refusal is committed (it is audited) before it is answered 403. An approver
        check that lost its connection decided nothing: 503, the approval pending."""
        try:
            decision, operation_id, decided_digest = self._decide(
                who, approval_id, verb, reason, impact_digest
            )
        except store.ApproverUnavailable as exc:
            raise ProblemError(
                503, ErrorCode.UPSTREAM_UNAVAILABLE, f"{exc}; the approval stays pending, try again",
                headers={"Retry-After": "1"},
            ) from None
        metrics.count_approval_decision(decision, verb)
        if decision.outcome is store.DecisionOutcome.APPROVER_NOT_ALLOWED:
            refusal = decision.refusal.value if decision.refusal else "refused"
            raise ProblemError(
                403, ErrorCode.APPROVER_NOT_ALLOWED,
                f"{who.principal} may not {verb.value} this approval; it stays pending",
                errors=[ProblemDetail(path="", code=refusal)],
            )
        if decision.outcome is store.DecisionOutcome.NOT_PENDING:
            raise ProblemError(409, ErrorCode.NOT_PENDING, "the approval is no longer pending")
        state = None
        if operation_id is not None:
            with read_only(self.engine).connect() as conn:
                row = store.get_operation(conn, operation_id)
            state = row.state if row is not None else None
        return DecisionOut(
            approval_id=approval_id,
            decision="approved" if verb is ApprovalDecision.APPROVE else "denied",
            decided_by=who.principal, operation_id=operation_id, state=state,
            impact_digest=decided_digest,
        )

    # ------------------------------------------------------------ needs a person

    def pending(self, who: Identity, limit: int = 100) -> list[PendingOut]:
        with read_only(self.engine).connect() as conn:
            rows = operator.reconciliation_pending(conn, tenant=who.tenant, limit=limit)
            receipts = {r.operation_id: operator.receipts_of(conn, r.operation_id) for r in rows}
            now = store.read_now(conn) if rows else 0.0
        return [
            PendingOut(
                operation_id=r.operation_id, request_id=r.request_id, call_id=r.call_id,
                tool=r.tool_name, generation=r.generation, since=moment(r.updated_at),
                reason=operator.operation_reason(r), cause=operator.operation_cause(r),
                receipts=[_receipt(x) for x in receipts[r.operation_id]],
                age_seconds=max(0.0, now - r.updated_at), arguments=json.loads(r.arguments),
                effects=self._effects(r.tool_name),
            )
            for r in rows
        ]

    def _effects(self, tool_name: str) -> list[str]:
        tool = self.registry.get(tool_name)
        return sorted(e.value for e in tool.effects) if tool is not None else []

    def resolve(
        self, who: Identity, operation_id: str, outcome: str, reference: str | None, note: str | None
    ) -> ResolveOut:
        if outcome == "succeeded" and not reference:
            raise ProblemError(
                400, ErrorCode.INVALID_REQUEST, "resolving as succeeded needs the downstream's reference",
                errors=[ProblemDetail(path="/reference", code="missing", expected="the downstream's id")],
            )
        if reference is not None and not storable(reference):
            raise ProblemError(
                400, ErrorCode.INVALID_REQUEST,
                "the reference must be printable text of at most 200 characters",
                errors=[
                    ProblemDetail(path="/reference", code="not_printable", expected="the downstream's id")
                ],
            )
        if not storable(operation_id):
            raise not_found("operation")
        with self.engine.begin() as conn:
            row = store.get_operation(conn, operation_id)
            if row is None or row.tenant != who.tenant:
                raise not_found("operation")
            won = operator.resolve_pending(
                conn, operation_id, outcome=outcome, actor=who.principal, reference=reference,
                note=note or "",
            )
            if not won:
                raise ProblemError(409, ErrorCode.NOT_PENDING, "the operation is not reconciliation_pending")
            resolved = store.get_operation(conn, operation_id)
        assert resolved is not None
        return ResolveOut(operation_id=operation_id, state=resolved.state, resolved_by=who.principal)

    def operation(self, who: Identity, operation_id: str) -> OperationOut:
        """One operation as a person reads it: state, receipts (each once), the audit
        trail, its arguments and output (redacted), its error message, how its approval
        was decided and why, and each call of its request with that call's state."""
        if not storable(operation_id):
            raise not_found("operation")
        with read_only(self.engine).connect() as conn:
            record = operator.operation_record(conn, operation_id, tenant=who.tenant)
            if record is None:
                raise not_found("operation")
            states = store.operations_in(
                conn, [c.operation_id for c in record.request_calls if c.operation_id]
            )
            approval = console_reads.approval_decision(conn, operation_id)
        row = record.row
        stored = json.loads(row.result) if row.result else None
        return OperationOut(
            operation_id=row.operation_id, request_id=row.request_id, call_id=row.call_id,
            tool=row.tool_name, state=row.state, generation=row.generation, attempts=row.attempts,
            error_code=row.error_code, cause=operator.operation_cause(row), receipt=row.receipt,
            receipts=[_receipt(r) for r in record.receipts], side_effects=record.side_effects,
            audit=[
                AuditEventOut(
                    at=e.at, from_state=e.from_state, to_state=e.to_state, decision=e.decision_code,
                    generation=e.generation, actor=e.actor,
                )
                for e in record.audit
            ],
            request_calls=[
                RequestCallOut(
                    call_id=c.call_id, tool_name=c.tool_name, operation_id=c.operation_id, gate=c.gate,
                    state=states[c.operation_id].state if c.operation_id in states else None,
                    error_code=(
                        states[c.operation_id].error_code if c.operation_id in states
                        else _call_error_code(c.result)
                    ),
                )
                for c in record.request_calls
            ],
            arguments=json.loads(row.arguments),
            output=stored.get("output", stored) if isinstance(stored, dict) else stored,
            error_message=operator.operation_reason(row),
            approval=(
                ApprovalDecisionOut(
                    state=approval.state, decided_by=approval.decided_by,  # type: ignore[arg-type]
                    decided_at=approval.decided_at, reason=approval.reason,
                )
                if approval is not None else None
            ),
        )


def _call_error_code(result: str | None) -> str | None:
    """The error code of a call refused at admission (its stored result)."""
    if not result:
        return None
    try:
        error = json.loads(result).get("error") or {}
    except (ValueError, AttributeError):
        return None
    return str(error["code"]) if isinstance(error, dict) and error.get("code") else None


KEY_SURFACE_UNDECLARED = "this key's turn surface is not declared by this server's tools"
SETTING_SURFACE_UNDECLARED = "this server's TOOLFENCE_TURN_SURFACE is not declared by its tools"
UNKNOWN_SURFACE_DETAIL = "unknown_surface"


def _surface_problem(message: str) -> ProblemError:
    """503 `turns_not_configured`: the server's configuration (its registry, its
    settings) does not cover the surface the work must run under; the operator's to
    fix, not the caller's. The surface's name is not echoed."""
    return ProblemError(
        503, ErrorCode.TURNS_NOT_CONFIGURED, message,
        errors=[ProblemDetail(path="", code=UNKNOWN_SURFACE_DETAIL)],
    )


def _receipt(row: Any) -> ReceiptOut:
    return ReceiptOut(
        receipt=row.receipt, generation=row.generation, accepted=bool(row.accepted), source=row.source
    )


def _answer(request_id: str, statuses: Sequence[CallStatus]) -> RequestAnswer:
    return RequestAnswer(
        request_id=request_id, calls=call_statuses(statuses),  # type: ignore[arg-type]
        settled=all(settled(s) for s in statuses),
    )


def request_id_for(who: Identity, idempotency_key: str) -> str:
    """The request an Idempotency-Key stands for, per (tenant, principal): the same
    key of two principals names two requests."""
    digest = hashlib.sha256(f"{who.tenant}\0{who.principal}\0{idempotency_key}".encode()).hexdigest()
    return f"req_{digest[:32]}"


def turn_id_for(who: Identity, idempotency_key: str) -> str:
    """The turn an Idempotency-Key stands for (per tenant and principal, as requests)."""
    digest = hashlib.sha256(f"turn\0{who.tenant}\0{who.principal}\0{idempotency_key}".encode()).hexdigest()
    return f"turn_{digest[:32]}"


def body_digest(value: Any, raw: bytes, kind: str = "") -> str:
    """The body's identity for Idempotency-Key: its canonical JSON (so key order and
    spacing do not matter), or its bytes when it has no canonical form."""
    try:
        data = canonical_json(value)
    except NotCanonicalizable:
        data = raw
    # `kind` keeps a turn's body from ever matching a request's under one key: the
    # same key on both endpoints is `idempotency_conflict`, never a replay of the other.
    return hashlib.sha256(kind.encode() + data).hexdigest()

