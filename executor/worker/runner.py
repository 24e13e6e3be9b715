"""Run one operation: reserve → heartbeat → re-check → tool.run → complete.

The broker message carries only the operation id; the database is the truth. A
message may arrive twice, late, for an operation that is not ready yet, or for
one that no longer exists: each case is a branch below that explains why it is
safe to acknowledge and move on, and each ends in an `Outcome` whose label is
counted. No database transaction is held open across the tool's downstream call.

The lease renewal loop lives in `heartbeat.py`; how a run ends (completion,
release to retry, unknown outcome, a write outside its approved set) is recorded
by `outcomes.py`, the base of `OperationRunner`; what a failure of the tool means
(retry, terminal, unknown outcome) is decided by the pure `failures.py`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from executor import store
from executor.core.admission import (
    Refusal,
    compute_intent_hash,
    recheck_access,
    recheck_before_run,
    recheck_surface,
)
from executor.core.sanitize import exception_summary
from executor.core.states import TERMINAL, ApprovalState, State
from executor.core.surfaces import surface_forces_approval
from executor.core.tools import (
    LostOwnership,
    Mode,
    Registry,
    RoleResolutionFailed,
    RunContext,
    StaleFencingToken,
    Tool,
)
from executor.core.types import ErrorCode, ErrorDetail, ServerContext
from executor.faults import AmbiguousCommit, Faults
from executor.settings import Settings
from executor.store import driver
from executor.store.engine import read_only, single_statement
from executor.store.errors import CONNECTION_ERRORS, bad_data_refusal
from executor.telemetry import logcontext, metrics, tracing
from executor.worker.heartbeat import Heartbeat
from executor.worker.outcomes import Outcome, OutcomeLabel, OutcomeRecorder, approved_resources, backoff

log = logging.getLogger("toolfence.worker")

MAX_OPERATION_ID_LENGTH = 200


class _ApprovalStatus(StrEnum):
    NONE = "none"  # admission asked no approval
    APPROVED = "approved"  # approved, for the intent the call still has
    INVALIDATED = "invalidated"  # not approved, or the intent changed since


@dataclass(frozen=True)
class Acquired:
    """A won reservation, and `time.monotonic()` taken before the statement that won it
    was sent: the heartbeat counts its first local deadline from there."""

    reservation: store.Reservation
    reserve_sent_at: float


class OperationRunner(OutcomeRecorder):
    def __init__(self, settings: Settings, registry: Registry, engine: Engine) -> None:
        self.settings = settings
        self.registry = registry
        self.engine = engine
        self.reader = read_only(engine)
        self.single = single_statement(engine)
        # The reservation and the completion, the two statements every operation
        # costs, run on the pooled driver connection (store/driver.py) on PostgreSQL.
        self.on_driver = driver.supported(engine)
        self.faults = Faults(settings)

    # ----------------------------------------------------------------- entry

    def handle(self, operation_id: object) -> Outcome:
        # The correlation ids of this operation on every record logged while it runs
        # (executor/telemetry/logcontext.py); the rest are bound once the row is read.
        known = operation_id if isinstance(operation_id, str) else None
        with logcontext.log_context(operation_id=known and known[:MAX_OPERATION_ID_LENGTH]):
            outcome = self._handle(operation_id)
        metrics.MESSAGES.labels(outcome.label.value).inc()
        return outcome

    def _handle(self, operation_id: object) -> Outcome:
        if not isinstance(operation_id, str) or not 0 < len(operation_id) <= MAX_OPERATION_ID_LENGTH:
            # Garbage on the queue: acknowledge and count; retrying cannot make it valid.
            return Outcome(OutcomeLabel.BAD_MESSAGE)
        first = self._reserve_first(operation_id)
        if first is not None:
            reserved, won = first
            return self._execute(reserved, self.registry.get(reserved.tool_name), won)
        with self.reader.connect() as conn:
            row = store.get_operation(conn, operation_id)
        if row is None:
            return Outcome(OutcomeLabel.UNKNOWN_OPERATION)
        state = State(row.state)
        if state in TERMINAL or state in (State.RECONCILIATION_PENDING, State.PENDING_APPROVAL):
            # A duplicate or late delivery: the outcome is already decided elsewhere.
            return Outcome(OutcomeLabel.DUPLICATE, state)
        tool = self.registry.get(row.tool_name)
        if state is State.RETRY_WAIT:
            # The relay/reconciler promotes it when due and publishes a fresh message.
            return Outcome(OutcomeLabel.NOT_DUE, state)
        acquired = self._acquire(row, tool)
        if isinstance(acquired, Outcome):
            return acquired
        return self._execute(row, tool, acquired)

    def _reserve_first(self, operation_id: str) -> tuple[store.OperationRow, Acquired] | None:
        """Most messages are the first delivery of a due operation that needs no
        predecessor check (a read, or a request's first call): reserve it and get its
        row in one statement (`store.reserve_first`), with no read before. None when
        that CAS lost (changing nothing): the caller reads the row and takes the
        general path, which decides duplicates, later writes and take-overs.

        Also None after a connection error when the row shows the reservation did
        not commit: a statement sent on a connection whose session had died (a
        pooled connection is pinged only after it sat idle, engine.py) ran nowhere,
        and the general path tries again on the new connection the invalidated pool
        hands out. If the row cannot be read, the general path's own read raises."""
        owner_token = store.new_owner_token()
        reserve_sent_at = time.monotonic()
        try:
            # One statement, so its own transaction (no BEGIN/COMMIT round trips).
            with self._single_statement() as conn:
                won = store.reserve_first(conn, operation_id, owner_token, self.settings.lease_seconds)
            if won is not None:
                # After the commit, as in `_acquire`.
                self.faults.fire("reserve_commit", won[1].tool_name)
        except (OperationalError, DBAPIError, AmbiguousCommit):
            recovered = self._recover_reservation(operation_id, owner_token)
            if recovered is None:
                # Not ours on the row: as if the CAS lost. (Should it have committed
                # unseen, the row is `started` under a token nobody holds: the
                # general path treats it as a live owner's, and its lease expiry
                # as a dead worker's.)
                return None
            return recovered[0], Acquired(recovered[1], reserve_sent_at)
        if won is None:
            return None
        return won[1], Acquired(won[0], reserve_sent_at)

    def _single_statement(self) -> AbstractContextManager[store.Executes]:
        return driver.autocommit(self.engine) if self.on_driver else self.single.begin()

    def _acquire(self, row: store.OperationRow, tool: Tool[Any] | None) -> Acquired | Outcome:
        owner_token = store.new_owner_token()
        lease = self.settings.lease_seconds
        state = State(row.state)
        if state is State.QUEUED and Mode(row.mode) is Mode.WRITE and row.position > 0:
            # The first call of a request has no predecessor: skip the check's transaction.
            with self.engine.begin() as conn:
                if store.predecessor_failed(conn, row.operation_id):
                    won = store.fail_unstarted(
                        conn, row.operation_id, ErrorCode.PREDECESSOR_FAILED,
                        "an earlier write of this request did not succeed",
                    )
                    if won:
                        metrics.OPERATIONS_TERMINAL.labels(
                            row.tool_name, State.FAILED_TERMINAL.value
                        ).inc()
                    return Outcome(OutcomeLabel.PREDECESSOR_FAILED)
        # Before the statement is sent, so also before the lease it sets begins on the
        # database clock. After an ambiguous commit this is still the time to keep.
        reserve_sent_at = time.monotonic()
        try:
            with self.engine.begin() as conn:
                if state is State.QUEUED:
                    reservation = store.reserve(conn, row.operation_id, owner_token, lease)
                elif tool is not None and tool.takeover_allowed:
                    reservation = store.take_over(conn, row.operation_id, owner_token, lease)
                else:
                    # A live owner, or a `lookup`/`unsafe` write whose lease expired: the
                    # reconciler decides those, never a second worker.
                    return Outcome(OutcomeLabel.OWNED_ELSEWHERE, state)
            if reservation is not None:
                # After the `with` block: the reservation has committed, so `ambiguous`
                # here is a real ambiguous commit (fired inside the block, it rolled back).
                self.faults.fire("reserve_commit", row.tool_name)
        except (OperationalError, DBAPIError, AmbiguousCommit):
            # Did the reservation commit? Our owner token is unique to this attempt.
            recovered = self._recover_reservation(row.operation_id, owner_token)
            if recovered is None:
                raise
            reservation = recovered[1]
        acquired = None if reservation is None else Acquired(reservation, reserve_sent_at)
        if acquired is None and state is State.STARTED and tool is not None:
            acquired = self._take_over_when_expired(row.operation_id, owner_token)
        if acquired is None:
            return Outcome(OutcomeLabel.NOT_READY, state)
        if acquired.reservation.took_over:
            metrics.LEASE_TAKEOVERS.labels(row.tool_name).inc()
        return acquired

    def _take_over_when_expired(self, operation_id: str, owner_token: str) -> Acquired | None:
        """A redelivered message (its worker died) usually arrives while the dead
        owner's lease still runs. Waiting out a lease this short, then taking over,
        finishes the operation now instead of at the reconciler's next sweep; if the
        owner is alive it renews meanwhile and the take-over simply loses."""
        with self.reader.connect() as conn:
            remaining = store.lease_remaining(conn, operation_id)
        if remaining is None or not 0 < remaining <= self.settings.lease_seconds:
            return None
        time.sleep(remaining + 0.05)
        take_over_sent_at = time.monotonic()
        with self.engine.begin() as conn:
            reservation = store.take_over(conn, operation_id, owner_token, self.settings.lease_seconds)
        return None if reservation is None else Acquired(reservation, take_over_sent_at)

    def _recover_reservation(
        self, operation_id: str, owner_token: str
    ) -> tuple[store.OperationRow, store.Reservation] | None:
        """After a connection error around a reservation: whether it committed (the
        owner token is unique to the attempt), with the row as it now is."""
        for attempt in range(5):
            try:
                with self.reader.connect() as conn:
                    row = store.get_operation(conn, operation_id)
                break
            except (OperationalError, DBAPIError):
                time.sleep(0.2 * (attempt + 1))
        else:
            return None
        if (
            row is None
            or row.owner_token != owner_token
            or State(row.state) is not State.STARTED
            or row.lease_expires_at is None
        ):
            return None
        log.info("reservation of %s committed despite a connection error", operation_id)
        return row, store.Reservation(
            operation_id, row.generation, owner_token, row.lease_expires_at, row.attempts, False
        )

    # ----------------------------------------------------------------- execution

    def _execute(
        self, row: store.OperationRow, tool: Tool[Any] | None, acquired: Acquired
    ) -> Outcome:
        logcontext.bind(
            request_id=row.request_id, call_id=row.call_id, tenant=row.tenant, tool=row.tool_name,
            generation=acquired.reservation.generation,
        )
        heartbeat = Heartbeat(
            self.engine, acquired.reservation, self.settings.lease_seconds,
            reserve_sent_at=acquired.reserve_sent_at,
        )
        heartbeat.start()
        reservation = acquired.reservation
        try:
            with tracing.attempt(
                row, reservation.generation, reservation.took_over, acquired.reserve_sent_at,
                lambda text: self._save_trace(reservation, text),
            ) as trace:
                outcome = self._execute_owned(row, tool, reservation, heartbeat, trace)
                trace.outcome(outcome.label.value)
                return outcome
        finally:
            heartbeat.stop()

    def _save_trace(self, reservation: store.Reservation, text: str) -> None:
        """The attempt's trace context on the row (tracing on only): the next attempt
        and the reconciler link to it (executor/telemetry/tracing.py)."""
        with self.engine.begin() as conn:
            store.save_attempt_trace(conn, reservation.operation_id, reservation.owner_token, text)

    def _execute_owned(
        self,
        row: store.OperationRow,
        tool: Tool[Any] | None,
        reservation: store.Reservation,
        heartbeat: Heartbeat,
        trace: tracing.NoSpan | tracing.Attempt,
    ) -> Outcome:
        arguments = json.loads(row.arguments)
        try:
            may_have_run = self._earlier_attempt_may_have_run(row, reservation)
        except CONNECTION_ERRORS:
            if tool is None:
                return Outcome(OutcomeLabel.STALE_COMPLETE)  # the lease expires; the reconciler decides
            return self._release_unstarted(row, tool, reservation)

        def refuse(refusal: Refusal) -> Outcome:
            return self._refuse_at_execution(row, reservation, refusal, may_have_run=may_have_run)

        try:
            # The principal's roles now, from the application (the stored admission
            # context when it registered no resolver): a revoked role stops the call.
            # A resolver that lost its connection decided nothing: as for the access
            # rule below, the operation is given back instead of denied for good.
            stored = ServerContext.from_json(json.loads(row.context))
            logcontext.bind(turn_id=stored.turn_id)
            context = self.registry.current_context(stored, reraise=CONNECTION_ERRORS)
        except CONNECTION_ERRORS as exc:
            if tool is None:
                return refuse(Refusal(ErrorCode.UNKNOWN_TOOL, "permission denied at execution time"))
            return self._unanswered(row, tool, reservation, exc, refuse)
        except RoleResolutionFailed as exc:
            log.error("the role resolver failed for %s: %s", row.operation_id, exception_summary(exc))
            return refuse(Refusal(
                ErrorCode.PERMISSION_DENIED, "permission denied at execution time",
                (ErrorDetail(path="", code="role_resolver_failed"),),
            ))
        # Access again, against *current* policy: a revoked permission fails closed
        # before the handler runs. A rule that lost its database connection (the
        # ledger's looks the account's tenant up) has decided nothing: like a `check`
        # below, the operation is given back to try again, not ended for good. One
        # whose database refused a value of the call has answered (`_unanswered`).
        try:
            denied = recheck_access(
                tool, row.tool_name, arguments, context, reraise=CONNECTION_ERRORS
            )
        except CONNECTION_ERRORS as exc:
            assert tool is not None  # recheck_access answers UNKNOWN_TOOL without raising
            return self._unanswered(row, tool, reservation, exc, refuse)
        if denied is not None or tool is None:
            return refuse(Refusal(
                denied or ErrorCode.UNKNOWN_TOOL, "permission denied at execution time",
            ))
        # The turn surface the call was admitted under, as declared now: its catalog
        # and its listed targets (the ids the server listed, stored with the call).
        surface_refusal = recheck_surface(self.registry, tool, arguments, context)
        if surface_refusal is not None:
            return refuse(surface_refusal)
        args = tool.input_model.model_validate(arguments)
        try:
            approval = self._approval_status(row, tool, args, context)
            if approval is _ApprovalStatus.INVALIDATED:
                return refuse(Refusal(
                    ErrorCode.APPROVAL_INVALIDATED, "the call changed since it was approved",
                ))
            # The approval requirement and the business rules against current state,
            # immediately before the downstream call: a balance spent since admission
            # (or since the approver looked) refuses the write here. Not after an
            # earlier attempt that may have reached the downstream: the facts then
            # include this operation's own effect (its transfer spent the balance), and
            # the downstream's idempotency key or fence answers the retry.
            refusal = recheck_before_run(
                tool, args, context, approved=approval is _ApprovalStatus.APPROVED,
                business_rules=not may_have_run, reraise=CONNECTION_ERRORS,
                forced_approval=surface_forces_approval(self.registry, tool, context),
            )
        except CONNECTION_ERRORS as exc:
            # The handler has not run: whatever the effect contract, trying again is
            # safe. Left `started`, the operation would wait for its lease to expire,
            # and an `unsafe` write would go to a person for nothing.
            return self._unanswered(row, tool, reservation, exc, refuse)
        if refusal is not None:
            return refuse(refusal)

        def on_receipt(receipt: str, accepted: bool) -> None:
            self._record_receipt(row.operation_id, reservation.generation, receipt, accepted=accepted)

        tool_span = trace.tool(tool.name, row.call_id)
        ctx = RunContext(
            operation_id=row.operation_id,
            idempotency_key=f"toolfence:{row.operation_id}",
            fencing_token=reservation.generation,
            deadline=time.time() + tool.timeout_seconds,
            server=context,
            attempt=reservation.attempts,
            call_id=row.call_id,
            approved_resources=approved_resources(row),
            still_owner=heartbeat.owned,
            on_receipt=on_receipt,
            traceparent=tool_span.traceparent,
            tracestate=tool_span.tracestate,
        )
        self.faults.fire("before_run", tool.name)
        metrics.HANDLER_INVOCATIONS.labels(tool.name).inc()
        started = time.perf_counter()
        try:
            with tool_span:
                value = tool.run(args, ctx)
        except StaleFencingToken:
            # The downstream saw a newer generation: we are a zombie. Its refusal is the
            # fence working; the new owner completes the operation.
            metrics.STALE_WRITES_FENCED.labels("downstream").inc()
            return Outcome(OutcomeLabel.FENCED_DOWNSTREAM)
        except LostOwnership:
            return Outcome(OutcomeLabel.LOST_OWNERSHIP)
        except Exception as exc:  # classified below, never re-raised into Celery
            return self._on_failure(row, tool, reservation, ctx, exc)
        finally:
            metrics.EXECUTION_SECONDS.labels(tool.name).observe(time.perf_counter() - started)
        return self._on_value(row, tool, reservation, value, (time.perf_counter() - started) * 1000)

    def _unanswered(
        self, row: store.OperationRow, tool: Tool[Any], reservation: store.Reservation,
        exc: BaseException, refuse: Callable[[Refusal], Outcome],
    ) -> Outcome:
        """A re-check hook raised one of `CONNECTION_ERRORS` before the handler ran. A
        value the database refused (`bad_data`, decision 0193) is an answer: the same
        statement is refused on every try, so the call is refused `invalid_arguments`
        now, rather than given back forever. Anything else decided nothing: given back."""
        refusal = bad_data_refusal(exc)
        if refusal is not None:
            return refuse(refusal)
        return self._release_unstarted(row, tool, reservation)

    def _release_unstarted(
        self, row: store.OperationRow, tool: Tool[Any], reservation: store.Reservation
    ) -> Outcome:
        """Give back an operation whose handler never ran (retry_wait, short backoff)."""
        error = {"message": "the database was unreachable before the tool ran", "details": []}

        def attempt() -> bool:
            with self.engine.begin() as conn:
                return store.release_to_retry(
                    conn, row.operation_id, reservation.generation, reservation.owner_token,
                    delay_seconds=backoff(tool, reservation.attempts),
                    error_code=ErrorCode.UPSTREAM_UNAVAILABLE, error=error,
                    decision=store.RELEASED_BEFORE_RUN,
                )

        if not self._with_ambiguity(attempt, row.operation_id, reservation, State.RETRY_WAIT):
            # Unreachable throughout (or no longer ours): the lease expires and the
            # reconciler decides, as after a crash.
            return Outcome(OutcomeLabel.STALE_COMPLETE)
        metrics.RETRIES.labels(tool.name, ErrorCode.UPSTREAM_UNAVAILABLE.value).inc()
        return Outcome(OutcomeLabel.RETRY_WAIT, State.RETRY_WAIT)

    def _approval_status(
        self, row: store.OperationRow, tool: Tool[Any], args: BaseModel, context: ServerContext
    ) -> _ApprovalStatus:
        if row.impact is None:
            # Admission stores an impact exactly when it asks for approval.
            return _ApprovalStatus.NONE
        with self.reader.connect() as conn:
            approval = store.approval_for_operation(conn, row.operation_id)
        if approval is None:
            return _ApprovalStatus.NONE
        try:
            current = compute_intent_hash(tool, args, context)
        except CONNECTION_ERRORS:
            raise  # the resources hook decided nothing: the caller gives the operation back
        except Exception:
            return _ApprovalStatus.INVALIDATED
        if approval.state != ApprovalState.APPROVED or current != approval.intent_hash:
            return _ApprovalStatus.INVALIDATED
        return _ApprovalStatus.APPROVED

    def _earlier_attempt_may_have_run(
        self, row: store.OperationRow, reservation: store.Reservation
    ) -> bool:
        """Only a write past its first generation can have an effect of its own already."""
        if Mode(row.mode) is not Mode.WRITE or reservation.generation <= 1:
            return False
        with self.reader.connect() as conn:
            return store.earlier_attempt_may_have_run(conn, row.operation_id, reservation.generation)

    def _refuse_at_execution(
        self, row: store.OperationRow, reservation: store.Reservation, refusal: Refusal,
        *, may_have_run: bool = False,
    ) -> Outcome:
        """started → failed_terminal before the handler ran: a re-check refused. The
        audit names it `<code>_at_execution`; the caller sees the stable code.

        When an earlier attempt may have applied the write, `failed_terminal` could
        be a lie: the operation goes to a person (`reconciliation_pending`) with the
        refusal as its cause, and this attempt does not run it."""
        metrics.EXECUTION_REFUSALS.labels(row.tool_name, refusal.code.value).inc()
        if may_have_run:
            details = [
                {"path": "", "code": f"{refusal.code.value}_at_execution", "expected": None},
                *(detail.model_dump() for detail in refusal.details),
            ]

            def attempt() -> bool:
                with self.engine.begin() as conn:
                    return store.mark_unknown(
                        conn, row.operation_id, reservation.generation,
                        owner_token=reservation.owner_token, reason="refused_after_earlier_attempt",
                        details=details,
                    )

            if self._with_ambiguity(attempt, row.operation_id, reservation, State.RECONCILIATION_PENDING):
                metrics.OPERATIONS_TERMINAL.labels(
                    row.tool_name, State.RECONCILIATION_PENDING.value
                ).inc()
            return Outcome(OutcomeLabel.RECONCILIATION_PENDING, State.RECONCILIATION_PENDING)
        return self._finish(
            row, reservation, succeeded=False, error_code=refusal.code,
            error={
                "message": refusal.message,
                "details": [detail.model_dump() for detail in refusal.details],
            },
            decision=f"{refusal.code.value}_at_execution",
        )

