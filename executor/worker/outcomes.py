"""How one run ends: the owner's completion, release, unknown outcome or scope
excess, each one CAS in the store, and what a tool's value or failure means.

The runner (`runner.py`) reserves, re-checks and calls the tool; what comes back
is recorded here. Every ending is a CAS on the owner's `(generation, owner_token)`
(`store.complete_counted`, `release_to_retry`, `mark_unknown`,
`mark_scope_exceeded`), so a stale owner's ending changes nothing and is counted
(`stale_complete`). A connection error around a CAS is resolved by reading the
row (`_with_ambiguity`): it committed, someone else moved it, or it is still ours
and tried again. A write's receipt is recorded whether the completion wins or not
(I1 counts distinct receipts). What a failure means (retry, terminal, unknown) is
decided by the pure `failures.py`, and acted on here.
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

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from tenacity import wait_exponential_jitter

from executor import store
from executor.core.sanitize import exception_summary, seal_error
from executor.core.scope import check_scope
from executor.core.states import State
from executor.core.tools import (
    Effect,
    InvalidResult,
    LookupAnswer,
    Mode,
    RunContext,
    Tool,
    Written,
)
from executor.core.types import ErrorCode
from executor.faults import AmbiguousCommit, Faults
from executor.store import driver
from executor.store.errors import CONNECTION_ERRORS, refused_for_bad_data
from executor.telemetry import metrics
from executor.worker.failures import (
    FailureDecision,
    Retry,
    RetryBudgetExhausted,
    Terminal,
    UnknownOutcome,
    classify_failure,
    rerun_within_budget,
)

log = logging.getLogger("toolfence.worker")


class OutcomeLabel(StrEnum):
    """What happened to one message. The values are the `outcome` label of
    `toolfence_worker_messages_total` (dashboards, alerts and tests read them)."""

    BAD_MESSAGE = "bad_message"
    UNKNOWN_OPERATION = "unknown_operation"
    DUPLICATE = "duplicate"
    NOT_DUE = "not_due"
    PREDECESSOR_FAILED = "predecessor_failed"
    OWNED_ELSEWHERE = "owned_elsewhere"
    NOT_READY = "not_ready"
    SUCCEEDED = "succeeded"
    FAILED_TERMINAL = "failed_terminal"
    RETRY_WAIT = "retry_wait"
    RECONCILIATION_PENDING = "reconciliation_pending"
    STALE_COMPLETE = "stale_complete"
    FENCED_DOWNSTREAM = "fenced_downstream"
    LOST_OWNERSHIP = "lost_ownership"


@dataclass(frozen=True)
class Outcome:
    """What happened to one message (a bounded label for metrics, and for tests)."""

    label: OutcomeLabel
    state: State | None = None


class OutcomeRecorder:
    """The endings of `OperationRunner` (which this is a base of): it provides the
    engine, its read-only twin, whether the hot statements run on the pooled driver
    connection, and the fault points."""

    engine: Engine
    reader: Engine
    on_driver: bool
    faults: Faults

    def _completion_connection(self) -> AbstractContextManager[store.Executes]:
        """On PostgreSQL the completion is one statement (the CAS, its audit event and
        receipt): in autocommit, one round trip instead of BEGIN, it and COMMIT. What may
        follow it (a request's successors woken, a receipt count read) is a transaction
        of its own after it (driver.first_statement_alone, docs/decisions/0229)."""
        return driver.first_statement_alone(self.engine) if self.on_driver else self.engine.begin()

    def _finish(
        self,
        row: store.OperationRow,
        reservation: store.Reservation,
        *,
        succeeded: bool,
        result: dict[str, Any] | None = None,
        receipt: str | None = None,
        error_code: ErrorCode | None = None,
        error: dict[str, Any] | None = None,
        duration_ms: float | None = None,
        decision: str | None = None,
        record_receipt: bool = False,
    ) -> Outcome:
        """complete (CAS). A stale owner's completion changes nothing and is counted.

        `record_receipt`: record `receipt` in the completing transaction, whether the
        CAS wins or not (a stale owner's receipt is evidence too, I1)."""
        side_effects: list[int] = []
        if error is not None:
            error = seal_error(error)  # a tool wrote its text: the model will read it

        def attempt() -> bool:
            with self._completion_connection() as conn:
                # The receipt, the completion and (a write) the count of its distinct
                # receipts: one statement on PostgreSQL (store.complete_counted).
                completion = store.complete_counted(
                    conn, row.operation_id, reservation.generation, reservation.owner_token,
                    row.intent_hash, succeeded=succeeded, result=result, receipt=receipt,
                    error_code=error_code, error=error, duration_ms=duration_ms,
                    decision=decision, record_receipt_from="worker" if record_receipt else None,
                    count_receipts=Mode(row.mode) is Mode.WRITE,
                )
            won = completion.won
            if completion.accepted_receipts is not None:
                side_effects.append(completion.accepted_receipts)
            if won:
                # After the commit, as for `reserve_commit`: the completion is durable and
                # `ambiguous` tells us otherwise.
                self.faults.fire("complete_commit", row.tool_name)
            return won

        to_state = State.SUCCEEDED if succeeded else State.FAILED_TERMINAL
        won = self._with_ambiguity(attempt, row.operation_id, reservation, to_state)
        if not won:
            metrics.STALE_WRITES_FENCED.labels("complete").inc()
            return Outcome(OutcomeLabel.STALE_COMPLETE)
        self._observe_terminal(row, to_state, side_effects[-1] if side_effects else None)
        label = OutcomeLabel.SUCCEEDED if succeeded else OutcomeLabel.FAILED_TERMINAL
        return Outcome(label, to_state)

    def _with_ambiguity(
        self,
        attempt: Callable[[], bool],
        operation_id: str,
        reservation: store.Reservation,
        to_state: State,
    ) -> bool:
        """Run a CAS; on a connection error, find out from the row whether it committed."""
        for retry in range(5):
            try:
                return bool(attempt())
            except (OperationalError, DBAPIError, AmbiguousCommit) as exc:
                log.warning(
                    "connection error around a CAS on %s: %s", operation_id, exception_summary(exc)
                )
                time.sleep(0.2 * (retry + 1))
                try:
                    with self.reader.connect() as conn:
                        row = store.get_operation(conn, operation_id)
                except (OperationalError, DBAPIError):
                    continue
                if row is None:
                    return False
                if row.generation != reservation.generation:
                    return False  # someone took over: ours did not win, or no longer matters
                state = State(row.state)
                if state is to_state and row.owner_token is None:
                    return True  # it committed before the connection failed
                if state is not State.STARTED or row.owner_token != reservation.owner_token:
                    return False
                # Still ours and not applied: try the CAS again.
        return False

    def _record_receipt(
        self, operation_id: str, generation: int, receipt: str, *, accepted: bool = True
    ) -> None:
        """Record the receipt, retrying through a short database outage.

        The effect has happened: giving up here (an exception into Celery) would
        leave the operation `started` until its lease expired, and an `unsafe`
        write would go to a person although the receipt was in hand. A receipt
        recorded twice is harmless: I1 counts distinct receipts.
        """
        for retry in range(5):
            try:
                with self.engine.begin() as conn:
                    if conn.dialect.name == "postgresql":
                        # No fsync wait for this observation: WAL is flushed in order, so the
                        # completion's synchronous commit, which follows, makes it durable too
                        # (and a crash before that loses only a record the ledger still has).
                        conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
                    store.record_receipt(
                        conn, operation_id, generation, receipt, accepted=accepted, source="worker",
                    )
                return
            except (OperationalError, DBAPIError):
                if retry == 4:
                    raise
                log.warning("could not record receipt of %s yet; retrying", operation_id)
                time.sleep(0.2 * (retry + 1))

    def _observe_terminal(
        self, row: store.OperationRow, terminal: State, side_effects: int | None = None
    ) -> None:
        metrics.OPERATIONS_TERMINAL.labels(row.tool_name, terminal.value).inc()
        metrics.ENQUEUE_TO_TERMINAL_SECONDS.labels(row.tool_name).observe(
            max(0.0, time.time() - row.created_at)
        )
        if Mode(row.mode) is Mode.WRITE:
            if side_effects is None:
                with self.reader.connect() as conn:
                    side_effects = store.distinct_accepted_receipts(conn, row.operation_id)
            metrics.SIDE_EFFECTS_PER_OPERATION.labels(row.tool_name).observe(side_effects)

    def _on_value(
        self,
        row: store.OperationRow,
        tool: Tool[Any],
        reservation: store.Reservation,
        value: Any,
        duration_ms: float,
    ) -> Outcome:
        receipt: str | None = None
        if tool.mode is Mode.WRITE:
            if not isinstance(value, Written):
                return self._finish(
                    row, reservation, succeeded=False, error_code=ErrorCode.INVALID_RESULT,
                    error={"message": "a write must return its downstream receipt"},
                )
            receipt = value.receipt
            # An `unsafe` write's receipt is recorded at once: after a crash it is the
            # only evidence a person has. Any other contract gets it back from the
            # downstream (a repeated key, a fence, a lookup), so on the way to
            # `succeeded` it is recorded in the completing transaction: one commit fewer.
            deferred = Effect.UNSAFE not in tool.effects
            if not deferred:
                self._record_receipt(row.operation_id, reservation.generation, receipt)
            metrics.SIDE_EFFECTS.labels(tool.name, ",".join(sorted(tool.effects))).inc()
            written, value = value, value.output
            self.faults.fire("after_effect", tool.name)
            outside = self._outside_approved_scope(
                row, tool, reservation, written, record_receipt=deferred,
            )
            if outside is not None:
                return outside
        else:
            deferred = False
        try:
            result = tool.stored_result(value)
        except InvalidResult as exc:
            if deferred and receipt is not None:
                self._record_receipt(row.operation_id, reservation.generation, receipt)
            return self._finish(
                row, reservation, succeeded=False, error_code=ErrorCode.INVALID_RESULT,
                error={"message": str(exc)}, receipt=receipt,
            )
        self.faults.fire("before_complete", tool.name)
        return self._finish(
            row, reservation, succeeded=True, receipt=receipt, duration_ms=duration_ms,
            result=result, record_receipt=deferred,
        )

    def _outside_approved_scope(
        self, row: store.OperationRow, tool: Tool[Any], reservation: store.Reservation,
        written: Written, *, record_receipt: bool,
    ) -> Outcome | None:
        """Approved set = changed set. Only for an operation admitted with a set (a tool
        declaring `resources`); None when the write stayed inside it (fewer is fine).

        The effect has happened and its receipt is recorded either way: a write that
        does not say what it changed is `invalid_result`, one that changed more than
        it was approved for goes to a person, never `succeeded`. `record_receipt`:
        the caller deferred it to the completion, so any other ending records it here.
        """
        approved = approved_resources(row)
        if approved is None:
            return None
        if record_receipt and (
            written.changed_resources is None or check_scope(approved, written.changed_resources)
        ):
            self._record_receipt(row.operation_id, reservation.generation, written.receipt)
        if written.changed_resources is None:
            return self._finish(
                row, reservation, succeeded=False, error_code=ErrorCode.INVALID_RESULT,
                error={"message": "a write that declares its resources must report those it changed"},
                receipt=written.receipt,
            )
        exceeded = check_scope(approved, written.changed_resources)
        if exceeded is None:
            return None
        metrics.APPROVAL_SCOPE_EXCEEDED.labels(tool.name).inc()
        log.warning(
            "operation %s changed %d resource(s) outside its approved set",
            row.operation_id, len(exceeded.outside),
        )

        def attempt() -> bool:
            with self.engine.begin() as conn:
                return store.mark_scope_exceeded(
                    conn, row.operation_id, reservation.generation,
                    owner_token=reservation.owner_token, receipt=written.receipt,
                    error=exceeded.error_json(written.receipt),
                )

        if not self._with_ambiguity(
            attempt, row.operation_id, reservation, State.RECONCILIATION_PENDING
        ):
            metrics.STALE_WRITES_FENCED.labels("complete").inc()
            return Outcome(OutcomeLabel.STALE_COMPLETE)
        metrics.OPERATIONS_TERMINAL.labels(tool.name, State.RECONCILIATION_PENDING.value).inc()
        return Outcome(OutcomeLabel.RECONCILIATION_PENDING, State.RECONCILIATION_PENDING)

    def _on_failure(
        self, row: store.OperationRow, tool: Tool[Any], reservation: store.Reservation,
        ctx: RunContext,
        exc: Exception,
    ) -> Outcome:
        """Classify a failure (pure, failures.py), then act on the decision."""
        decision = classify_failure(
            exc, tool, attempts=reservation.attempts, connection_errors=CONNECTION_ERRORS,
            bad_data=refused_for_bad_data,
        )
        if decision.unexpected:
            # The code and the operation id; the tool's message only through the
            # sanitiser (it may quote its arguments or what the downstream said).
            log.error(
                "operation %s: tool %s raised (%s): %s", row.operation_id, tool.name,
                _decision_code(decision), exception_summary(exc),
            )
        return self._act_on(row, tool, reservation, ctx, decision)

    def _act_on(
        self, row: store.OperationRow, tool: Tool[Any], reservation: store.Reservation,
        ctx: RunContext,
        decision: FailureDecision,
    ) -> Outcome:
        if isinstance(decision, UnknownOutcome):
            return self._unknown_outcome(row, tool, reservation, ctx, decision)
        if isinstance(decision, Terminal):
            return self._finish(
                row, reservation, succeeded=False, error_code=decision.code,
                error={"message": decision.message, "details": list(decision.details)},
            )
        if isinstance(decision, RetryBudgetExhausted):
            return self._finish(
                row, reservation, succeeded=False, error_code=ErrorCode.RETRY_BUDGET_EXHAUSTED,
                error={"message": decision.message, "details": list(decision.details)},
            )
        return self._release_to_retry(row, tool, reservation, decision)

    def _release_to_retry(
        self, row: store.OperationRow, tool: Tool[Any], reservation: store.Reservation,
        decision: Retry,
    ) -> Outcome:
        error = seal_error({"message": decision.message, "details": list(decision.details)})
        delay = backoff(tool, reservation.attempts)

        def attempt() -> bool:
            with self.engine.begin() as conn:
                return store.release_to_retry(
                    conn, row.operation_id, reservation.generation, reservation.owner_token,
                    delay_seconds=delay, error_code=decision.code, error=error,
                )

        # Through a short outage, as completion does: otherwise the operation waits for
        # its lease to expire (and the reconciler) although we know what to do with it.
        won = self._with_ambiguity(attempt, row.operation_id, reservation, State.RETRY_WAIT)
        if not won:
            metrics.STALE_WRITES_FENCED.labels("complete").inc()
            return Outcome(OutcomeLabel.STALE_COMPLETE)
        metrics.RETRIES.labels(tool.name, decision.code.value).inc()
        return Outcome(OutcomeLabel.RETRY_WAIT, State.RETRY_WAIT)

    def _unknown_outcome(
        self, row: store.OperationRow, tool: Tool[Any], reservation: store.Reservation,
        ctx: RunContext,
        decision: UnknownOutcome,
    ) -> Outcome:
        """A write failed in a way that does not say whether its effect happened."""
        if decision.ask_lookup and tool.lookup is not None:
            args = tool.input_model.model_validate(json.loads(row.arguments))
            try:
                answer = tool.lookup(args, ctx)
            except Exception:
                answer = None
            if answer is not None and answer.answer is LookupAnswer.DONE and answer.written:
                return self._on_value(row, tool, reservation, answer.written, 0.0)
            if answer is not None and answer.answer is LookupAnswer.NOT_DONE:
                # It did not happen: running it again is safe, within the budget.
                return self._act_on(
                    row, tool, reservation, ctx,
                    rerun_within_budget(tool, attempts=reservation.attempts),
                )

        def attempt() -> bool:
            with self.engine.begin() as conn:
                return store.mark_unknown(
                    conn, row.operation_id, reservation.generation,
                    owner_token=reservation.owner_token, reason="outcome_unknown",
                    details=decision.details,
                )

        won = self._with_ambiguity(
            attempt, row.operation_id, reservation, State.RECONCILIATION_PENDING
        )
        if won:
            metrics.OPERATIONS_TERMINAL.labels(tool.name, State.RECONCILIATION_PENDING.value).inc()
        return Outcome(OutcomeLabel.RECONCILIATION_PENDING, State.RECONCILIATION_PENDING)


def approved_resources(row: store.OperationRow) -> frozenset[str] | None:
    """The set recorded at admission (None: the operation was admitted without one)."""
    if row.approved_resources is None:
        return None
    return frozenset(json.loads(row.approved_resources))


def backoff(tool: Tool[Any], attempt: int) -> float:
    """Exponential backoff with jitter (tenacity's strategy), on the database clock."""
    strategy = wait_exponential_jitter(
        initial=tool.retry.initial_backoff_seconds,
        max=tool.retry.max_backoff_seconds,
        jitter=tool.retry.initial_backoff_seconds,
    )

    class _State:
        attempt_number = attempt

    return float(strategy(_State()))  # type: ignore[arg-type]


def _decision_code(decision: FailureDecision) -> str:
    """The code a failure decision records (`outcome_unknown` for an unknown outcome)."""
    if isinstance(decision, UnknownOutcome):
        return "outcome_unknown"
    return decision.code.value
