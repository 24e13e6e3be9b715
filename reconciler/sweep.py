"""The reconciler: one sweep per run, safe to run twice at once.

It resolves what a dead worker, a lost message or a silent approver left behind:

- `started` operations whose lease expired, by the tool's effect contract:
  reads, `idempotent` and `fenced` writes go back to `queued` (the next
  reservation takes a new generation, which fences the dead owner); `lookup`
  writes ask the downstream whether the effect happened (done → succeeded,
  not done → queued, cannot tell or the lookup fails → `reconciliation_pending`);
  `unsafe` writes go to `reconciliation_pending` and are never retried
  automatically. One sweep drains them batch by batch, however many there are.
- `queued` operations waiting longer than a threshold are republished through
  the outbox (a broker restart without persistence loses queued messages).
- `retry_wait` operations whose backoff passed are requeued.
- approvals past their expiry are expired (the call ends `approval_denied`; a hosted
  MCP approval is answered approve=false).
- turns: a running turn whose owner's lease expired is given back with a fresh
  outbox row (the next job takes a new generation); an unowned running turn whose
  message was lost is republished; a turn waiting for approval whose approvals
  are all decided runs again (`executor/store/turns.py`; never the worker's code).

Every change is one of the store's CAS statements on the generation it observed
and an expired lease, so two reconcilers (or a reconciler and a worker) never
both win: the loser's statement matches no row.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, Engine

from executor import store
from executor.core.sanitize import exception_summary
from executor.core.scope import check_scope
from executor.core.states import State
from executor.core.tools import Effect, InvalidResult, LookupAnswer, Registry, RunContext, Tool, load_registry
from executor.core.types import ServerContext
from executor.settings import Settings
from executor.store import turns as turn_store
from executor.store.engine import read_only
from executor.telemetry import logcontext, metrics, tracing

log = logging.getLogger("toolfence.reconciler")


@dataclass(frozen=True)
class _Done:
    """The downstream says the effect happened: the result to record, and its receipt."""

    result: dict[str, Any]
    receipt: str


@dataclass(frozen=True)
class _NotDone:
    """The downstream says the effect did not happen: running it again is safe."""


@dataclass(frozen=True)
class _CannotTell:
    """No usable answer: a person decides. `reason` is a stable code for the audit trail."""

    reason: str


_Answer = _Done | _NotDone | _CannotTell


@dataclass
class SweepReport:
    actions: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.actions.values())

    def count(self, action: str) -> None:
        self.actions[action] += 1
        metrics.RECONCILER_ACTIONS.labels(action).inc()

    def as_dict(self) -> dict[str, Any]:
        return {"actions": dict(sorted(self.actions.items())), "seconds": round(self.seconds, 3)}


class Reconciler:
    def __init__(self, settings: Settings, engine: Engine, registry: Registry) -> None:
        self.settings = settings
        self.engine = engine
        self.reader = read_only(engine)
        self.registry = registry

    @classmethod
    def from_settings(cls, settings: Settings, engine: Engine) -> Reconciler:
        return cls(settings, engine, load_registry(settings.require_tools()))

    def sweep(self) -> SweepReport:
        report = SweepReport()
        started = time.perf_counter()
        self._stale_started(report)
        self._due_retries(report)
        self._stale_queued(report)
        self._expired_approvals(report)
        self._turns(report)
        report.seconds = time.perf_counter() - started
        return report

    # ------------------------------------------------------------------ started

    def _stale_started(self, report: SweepReport) -> None:
        """Batch after batch until nothing stale is left: one cron run drains a backlog.

        Each batch leaves the stale set (every claimed operation is settled by a
        CAS, ours or a concurrent reconciler's), so the loop ends; the `seen` set
        also ends it should an operation come back in the same generation.
        """
        seen: set[tuple[str, int]] = set()
        while True:
            claimed, needs_lookup = self._settle_batch(report, seen)
            for op, tool in needs_lookup:
                with _operation_scope(op):
                    self._resolve_by_lookup(op, tool, report)
            if not claimed:
                return

    def _settle_batch(
        self, report: SweepReport, seen: set[tuple[str, int]]
    ) -> tuple[int, list[tuple[store.StaleOperation, Tool[Any]]]]:
        """Claim a batch and settle what needs no downstream call, in one short transaction.

        SKIP LOCKED on PostgreSQL, so a second reconciler claims other rows. Lookups
        are returned to run after the commit: no transaction is held open across a
        downstream call. Returns how many operations were new to this sweep.
        """
        needs_lookup: list[tuple[store.StaleOperation, Tool[Any]]] = []
        claimed = 0
        with self.engine.begin() as conn:
            stale = store.stale_started(conn, self.settings.reconcile_batch_size, skip_locked=True)
            for op in stale:
                if (op.operation_id, op.generation) in seen:
                    continue
                seen.add((op.operation_id, op.generation))
                claimed += 1
                with _operation_scope(op):
                    self._settle_one(conn, op, needs_lookup, report)
        return claimed, needs_lookup

    def _settle_one(
        self, conn: Connection, op: store.StaleOperation,
        needs_lookup: list[tuple[store.StaleOperation, Tool[Any]]], report: SweepReport,
    ) -> None:
        tool = self.registry.get(op.tool_name)
        if tool is None:
            self._mark_pending(conn, op, "unknown", "tool_no_longer_declared", report)
        elif tool.takeover_allowed:
            if store.requeue_stale(conn, op.operation_id, op.generation):
                report.count("requeued_stale")
        elif Effect.LOOKUP in tool.effects and tool.lookup is not None:
            needs_lookup.append((op, tool))
        else:
            # `unsafe`: the effect may have happened; only a person may decide.
            self._mark_pending(conn, op, tool.name, "outcome_unknown_after_lost_lease", report)

    def _mark_pending(
        self, conn: Connection, op: store.StaleOperation, tool_label: str, reason: str,
        report: SweepReport,
    ) -> None:
        if store.mark_unknown_expired(conn, op.operation_id, op.generation, reason=reason):
            report.count("marked_pending")
            metrics.OPERATIONS_TERMINAL.labels(tool_label, "reconciliation_pending").inc()

    def _resolve_by_lookup(
        self, op: store.StaleOperation, tool: Tool[Any], report: SweepReport
    ) -> None:
        with self.reader.connect() as conn:
            row = store.get_operation(conn, op.operation_id)
        if row is None or row.state != State.STARTED or row.generation != op.generation:
            return  # someone else settled it meanwhile
        logcontext.bind(request_id=row.request_id, call_id=row.call_id, tenant=row.tenant)
        answer = self._ask(row, tool)
        with self.engine.begin() as conn:
            if isinstance(answer, _Done):
                if store.record_lookup_result(
                    conn, op.operation_id, op.generation, receipt=answer.receipt,
                    result=answer.result,
                ):
                    store.record_receipt(
                        conn, op.operation_id, op.generation, answer.receipt,
                        accepted=True, source="reconciler",
                    )
                    report.count("lookup_succeeded")
                    metrics.OPERATIONS_TERMINAL.labels(tool.name, "succeeded").inc()
            elif isinstance(answer, _NotDone):
                if store.requeue_stale(conn, op.operation_id, op.generation):
                    report.count("lookup_requeued")
            else:
                self._mark_pending(conn, op, tool.name, answer.reason, report)

    def _ask(self, row: Any, tool: Tool[Any]) -> _Answer:
        """The downstream's answer for one operation, or the reason it gave none.

        Anything that goes wrong here (arguments that no longer fit the tool's
        model, a lookup that raises, an answer that does not fit the output model)
        is "cannot tell": the operation goes to a person rather than stopping the
        sweep, where it would stop every later sweep too.
        """
        assert tool.lookup is not None
        try:
            args = tool.input_model.model_validate(json.loads(row.arguments))
            # The sweep's span (tracing on): the lookup's downstream joins the request's trace.
            traceparent, tracestate = tracing.current_context()
            ctx = RunContext(
                operation_id=row.operation_id,
                idempotency_key=f"toolfence:{row.operation_id}",
                fencing_token=row.generation,
                deadline=time.time() + tool.timeout_seconds,
                server=ServerContext.from_json(json.loads(row.context)),
                attempt=row.attempts,
                call_id=row.call_id,
                still_owner=lambda: False,  # the reconciler only asks; it never writes downstream
                traceparent=traceparent, tracestate=tracestate,
            )
            answer = tool.lookup(args, ctx)
            if answer.answer is LookupAnswer.NOT_DONE:
                return _NotDone()
            if answer.answer is not LookupAnswer.DONE or answer.written is None:
                return _CannotTell("lookup_could_not_answer")
            result = tool.stored_result(answer.written.output)
            if row.approved_resources is not None and (
                answer.written.changed_resources is None
                or check_scope(
                    frozenset(json.loads(row.approved_resources)), answer.written.changed_resources
                ) is not None
            ):
                # Approved set = changed set (executor/core/scope.py): never `succeeded`.
                return _CannotTell("approval_scope_exceeded")
        except Exception as exc:
            # No traceback for a validation error: its text quotes the stored arguments.
            log.warning(
                "lookup for %s gave no usable answer: %s", row.operation_id,
                type(exc).__name__ if isinstance(exc, ValidationError | InvalidResult)
                else exception_summary(exc),
            )
            return _CannotTell("lookup_failed")
        return _Done(result, answer.written.receipt)

    # ------------------------------------------------------------------ the rest

    def _drain(
        self,
        report: SweepReport,
        action: str,
        find: Callable[[Connection, int], list[str]],
        settle: Callable[[Connection, str], bool],
        field: str | None = None,
    ) -> None:
        """Find a batch, settle each in its own transaction (a CAS), until none is left.

        Every found item leaves the found set, settled by us or by a concurrent
        reconciler or worker; a batch with nothing new in it ends the loop anyway.
        """
        seen: set[str] = set()
        while True:
            with self.reader.connect() as conn:
                found = [item for item in find(conn, self.settings.reconcile_batch_size)
                         if item not in seen]
            if not found:
                return
            for item in found:
                seen.add(item)
                # An item that is an operation's or a turn's id is that log field meanwhile.
                with logcontext.log_context(**({field: item} if field else {})), self.engine.begin() as conn:
                    if settle(conn, item):
                        report.count(action)

    def _due_retries(self, report: SweepReport) -> None:
        self._drain(report, "promoted_retry", store.due_retries, store.promote_due_retry, "operation_id")

    def _stale_queued(self, report: SweepReport) -> None:
        threshold = self.settings.reconcile_queued_after_seconds
        self._drain(
            report,
            "republished_queued",
            lambda conn, limit: store.stale_queued(conn, threshold, limit),
            # Still stale at the CAS: a concurrent reconciler that republished it
            # first refreshed `queued_at`, and this one then changes nothing.
            lambda conn, operation_id: store.republish_queued(
                conn, operation_id, older_than_seconds=threshold
            ),
            "operation_id",
        )

    def _expired_approvals(self, report: SweepReport) -> None:
        self._drain(
            report,
            "approval_expired",
            store.expired_approvals,
            lambda conn, approval_id: store.expire_approval(
                conn, approval_id, approver="reconciler", reason="expired"
            ),
        )
        # Hosted MCP approvals (no operation): expired, they are answered approve=false.
        self._drain(
            report,
            "hosted_approval_expired",
            store.expired_hosted_approvals,
            lambda conn, approval_id: store.expire_hosted_approval(
                conn, approval_id, approver="reconciler", reason="expired"
            ),
        )

    def _turns(self, report: SweepReport) -> None:
        """Turns a dead worker, a lost message or a decided approval left behind."""
        self._drain(
            report,
            "turn_requeued_stale",
            lambda conn, limit: [f"{t.turn_id}\0{t.generation}" for t in turn_store.stale_turns(conn, limit)],
            lambda conn, key: turn_store.requeue_stale_turn(
                conn, key.split("\0")[0], int(key.split("\0")[1])
            ),
        )
        threshold = self.settings.reconcile_queued_after_seconds
        self._drain(
            report,
            "turn_republished",
            lambda conn, limit: turn_store.unowned_turns(conn, threshold, limit),
            lambda conn, turn_id: turn_store.republish_turn(conn, turn_id, threshold),
            "turn_id",
        )
        # Approved (or denied, or expired): the turn goes on; its model is told the
        # outcome. A user who started another turn meanwhile keeps this one waiting.
        self._drain(
            report, "turn_resumed", turn_store.decided_waiting_turns, turn_store.wake_turn, "turn_id"
        )
        # A queued turn whose scope is free (its predecessor's owner died before
        # promoting it, or the scope was freed otherwise).
        self._drain(
            report,
            "turn_promoted",
            turn_store.free_scopes_with_queued_turns,
            lambda conn, key: turn_store.promote_queued_turn(
                conn, key.split("\0", 1)[0], key.split("\0", 1)[1]
            ),
        )


@contextmanager
def _operation_scope(op: store.StaleOperation) -> Iterator[None]:
    """The sweep item's ids on what is logged while it is settled, in a span of its
    request's trace linked to the attempt whose lease expired (tracing on)."""
    with (
        logcontext.log_context(operation_id=op.operation_id, generation=op.generation, tool=op.tool_name),
        tracing.reconcile_span(op.operation_id, op.generation, op.trace_context),
    ):
        yield
