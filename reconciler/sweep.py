"""The reconciler: one sweep per run, safe to run twice at once.

It resolves what a dead worker, a lost message or a silent approver left behind:

- `started` operations whose lease expired, by the tool's effect contract:
  reads, `idempotent` and `fenced` writes go back to `queued` (the next
  reservation takes a new generation, which fences the dead owner); `lookup`
  writes ask the downstream whether the effect happened (done → succeeded,
  not done → queued, cannot tell → `reconciliation_pending`); `unsafe` writes go
  to `reconciliation_pending` and are never retried automatically.
- `queued` operations waiting longer than a threshold are republished through
  the outbox (a broker restart without persistence loses queued messages).
- `retry_wait` operations whose backoff passed are requeued.
- approvals past their expiry are denied.

Every change is one of the store's CAS statements on the generation it observed
and an expired lease, so two reconcilers (or a reconciler and a worker) never
both win: the loser's statement matches no row.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from executor import metrics, store
from executor.celery_app import load_registry
from executor.db import read_only
from executor.settings import Settings
from executor.tools import Effect, LookupAnswer, Registry, RunContext, Tool
from executor.types import ServerContext

log = logging.getLogger("toolfence.reconciler")


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
        return cls(settings, engine, load_registry(settings.tools_module))

    def sweep(self) -> SweepReport:
        report = SweepReport()
        started = time.perf_counter()
        self._stale_started(report)
        self._due_retries(report)
        self._stale_queued(report)
        self._expired_approvals(report)
        report.seconds = time.perf_counter() - started
        return report

    # ------------------------------------------------------------------ started

    def _stale_started(self, report: SweepReport) -> None:
        needs_lookup: list[store.StaleOperation] = []
        # Claim a batch (SKIP LOCKED on PostgreSQL, so a second reconciler takes
        # other rows) and settle every operation that needs no downstream call in
        # the same short transaction. Lookups happen after it commits.
        with self.engine.begin() as conn:
            stale = store.stale_started(conn, self.settings.reconcile_batch_size, skip_locked=True)
            for op in stale:
                tool = self.registry.get(op.tool_name)
                if tool is None:
                    if store.mark_unknown(conn, op.operation_id, op.generation, owner_token=None,
                                          reason="tool_no_longer_declared"):
                        report.count("marked_pending")
                        metrics.OPERATIONS_TERMINAL.labels("unknown", "reconciliation_pending").inc()
                elif tool.takeover_allowed:
                    if store.requeue_stale(conn, op.operation_id, op.generation):
                        report.count("requeued_stale")
                elif Effect.LOOKUP in tool.effects and tool.lookup is not None:
                    needs_lookup.append(op)
                elif store.mark_unknown(conn, op.operation_id, op.generation, owner_token=None,
                                        reason="outcome_unknown_after_lost_lease"):
                    report.count("marked_pending")
                    metrics.OPERATIONS_TERMINAL.labels(tool.name, "reconciliation_pending").inc()
        for op in needs_lookup:
            tool = self.registry.get(op.tool_name)
            assert tool is not None
            self._resolve_by_lookup(op, tool, report)

    def _resolve_by_lookup(self, op: store.StaleOperation, tool: Tool[Any], report: SweepReport) -> None:
        with self.reader.connect() as conn:
            row = store.get_operation(conn, op.operation_id)
        if row is None or row.state != "started" or row.generation != op.generation:
            return  # someone else settled it meanwhile
        context = ServerContext.from_json(json.loads(row.context))
        args = tool.input_model.model_validate(json.loads(row.arguments))
        ctx = RunContext(
            operation_id=row.operation_id,
            idempotency_key=f"toolfence:{row.operation_id}",
            fencing_token=row.generation,
            deadline=time.time() + tool.timeout_seconds,
            server=context,
            attempt=row.attempts,
            still_owner=lambda: False,  # the reconciler only asks; it never writes downstream
        )
        assert tool.lookup is not None
        try:
            answer = tool.lookup(args, ctx)
        except Exception:
            log.warning("lookup for %s failed", op.operation_id, exc_info=True)
            answer = None
        with self.engine.begin() as conn:
            if answer is not None and answer.answer is LookupAnswer.DONE and answer.written:
                output = tool.output_model.model_validate(
                    answer.written.output.model_dump(mode="json")
                    if hasattr(answer.written.output, "model_dump") else answer.written.output
                ).model_dump(mode="json")
                view = tool.project(tool.output_model.model_validate(output)) if tool.project else output
                if store.record_lookup_result(
                    conn, op.operation_id, op.generation, receipt=answer.written.receipt,
                    result={"output": output, "model_view": view, "untrusted": tool.untrusted_output},
                ):
                    store.record_receipt(
                        conn, op.operation_id, op.generation, answer.written.receipt,
                        accepted=True, source="reconciler",
                    )
                    report.count("lookup_succeeded")
                    metrics.OPERATIONS_TERMINAL.labels(tool.name, "succeeded").inc()
            elif answer is not None and answer.answer is LookupAnswer.NOT_DONE:
                if store.requeue_stale(conn, op.operation_id, op.generation):
                    report.count("lookup_requeued")
            elif store.mark_unknown(conn, op.operation_id, op.generation, owner_token=None,
                                    reason="lookup_could_not_answer"):
                report.count("marked_pending")
                metrics.OPERATIONS_TERMINAL.labels(tool.name, "reconciliation_pending").inc()

    # ------------------------------------------------------------------ the rest

    def _due_retries(self, report: SweepReport) -> None:
        with self.reader.connect() as conn:
            due = store.due_retries(conn, self.settings.reconcile_batch_size)
        for operation_id in due:
            with self.engine.begin() as conn:
                if store.promote_due_retry(conn, operation_id):
                    report.count("promoted_retry")

    def _stale_queued(self, report: SweepReport) -> None:
        with self.reader.connect() as conn:
            waiting = store.stale_queued(
                conn, self.settings.reconcile_queued_after_seconds, self.settings.reconcile_batch_size
            )
        for operation_id in waiting:
            with self.engine.begin() as conn:
                if store.republish_queued(conn, operation_id):
                    report.count("republished_queued")

    def _expired_approvals(self, report: SweepReport) -> None:
        with self.reader.connect() as conn:
            expired = store.expired_approvals(conn, self.settings.reconcile_batch_size)
        for approval_id in expired:
            with self.engine.begin() as conn:
                if store.deny(conn, approval_id, approver="reconciler", reason="expired", expired=True):
                    report.count("approval_expired")

