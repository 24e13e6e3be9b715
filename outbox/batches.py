"""`enqueue_many`: many requests admitted and written in one transaction.

A producer draining its own queue has many requests at hand, each its own
conversation turn or job. `enqueue_many` admits them as `enqueue` admits each one
(its own idempotency, budgets, repeat rules, ordering and results) with a constant
number of round trips on PostgreSQL: one for every request's locks and reads
(`store.read_for_admissions`), one for every request's rows (`store.Writes`), as
for a single request (docs/decisions/0233-enqueue-many-admits-many-requests-in-one-transaction.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from executor import store
from executor.core.admission import Limits
from executor.core.budgets import Budgets
from executor.core.identifiers import InvalidIdentifier, check_server_context
from executor.core.tools import Registry
from executor.core.types import ProposedCall, ServerContext
from executor.settings import current as current_settings
from executor.store.batch_reads import AdmissionScope, read_for_admissions
from executor.store.errors import store_errors
from executor.telemetry import tracing
from outbox.handles import EnqueueHandle
from outbox.producer import (
    InvalidBatch,
    _admit_request,
    _check_batch,
    _plan,
    _write_tools,
)
from outbox.results import connection_of

MAX_REQUESTS = 200
"""At most this many requests in one `enqueue_many`: its transaction holds an
advisory lock per request and per conversation until it ends, and PostgreSQL's
shared lock table (`max_locks_per_transaction` × connections, 6,400 slots by
default) is shared by every session."""


@dataclass(frozen=True)
class QueuedRequest:
    """One request of an `enqueue_many`: its proposed calls, its server context
    (whose `request_id` names it) and, as for `enqueue`, the operation ids the
    caller chose for some of its calls."""

    calls: Sequence[ProposedCall]
    context: ServerContext
    operation_ids: Mapping[str, str] | None = None


def enqueue_many(
    session: Session | Connection,
    requests: Sequence[QueuedRequest | tuple[Sequence[ProposedCall], ServerContext]],
    registry: Registry,
    *,
    limits: Limits | None = None,
    budgets: Budgets | None = None,
) -> list[EnqueueHandle]:
    """Admit each request as `enqueue` would and write every row in the caller's
    transaction: one `EnqueueHandle` per request, in order.

    Each request keeps its own idempotency (enqueueing it again answers each call
    from what is recorded), budgets (`budgets.for_tenant` of its tenant), repeat
    rules, proposal order and results. Requests are decided in the order given:
    a later request of the same conversation counts the calls and writes an earlier
    one decided, exactly as if they had been enqueued one after the other in one
    transaction. Per-call refusals (a bad call id, a gate) are results, as for
    `enqueue`, and never affect the other requests.

    What refuses the whole batch, before anything touches the database (the
    caller's transaction and rows stay as they were, nothing of any request is
    written): a request whose server context breaks the identifier contract
    (`InvalidIdentifier`), an empty or duplicate call id within a request, the
    same (tenant, request id) twice, or more than `MAX_REQUESTS` requests
    (`InvalidBatch`). Either error's `request_index` names the request.

    Raised once the database is involved (`StoreDatabaseError`,
    `AdmissionUnavailable` from any request's hook): the rows decided so far may
    be in the transaction; roll it back and enqueue the batch again (every request
    then answers as if first enqueued, or from what it recorded). Hosted calls are
    `enqueue(hosted=...)`'s alone.
    """
    items = [r if isinstance(r, QueuedRequest) else QueuedRequest(r[0], r[1]) for r in requests]
    _check_requests(items)
    if not items:
        return []
    with store_errors():
        conn = connection_of(session)
        limits = limits or current_settings().limits
        plans = [_plan(i.calls, i.context, registry, i.operation_ids, limits) for i in items]
        reads = read_for_admissions(conn, [
            AdmissionScope(
                p.context.tenant, p.context.request_id, p.context.conversation_id, p.hashes, p.candidate_ids
            )
            for p in plans
        ])
        writes = store.Writes(now=reads[0].now)
        write_tools = _write_tools(registry)
        first: store.Intake | None = None  # whose registrations every request shares
        handles: list[EnqueueHandle] = []
        for plan, read in zip(plans, reads, strict=True):
            context = plan.context
            with tracing.enqueue_span(context.tenant, context.request_id, len(plan.calls)):
                intake = store.Intake(conn, read, writes, write_tools)
                if first is None:
                    first = intake
                else:
                    intake.share(first)
                calls, _ = _admit_request(intake, plan, registry, limits, budgets)
            handles.append(EnqueueHandle(context.request_id, tuple(calls)))
        if conn.dialect.name == "postgresql":
            writes.notify()  # once for the batch: the relay wakes once
        writes.flush(conn)
        return handles


def _check_requests(items: Sequence[QueuedRequest]) -> None:
    if len(items) > MAX_REQUESTS:
        raise InvalidBatch("too_many_requests", f"at most {MAX_REQUESTS} requests in one enqueue_many")
    seen: set[tuple[str, str]] = set()
    for index, item in enumerate(items):
        try:
            _check_batch(item.calls)
            check_server_context(item.context)
        except (InvalidBatch, InvalidIdentifier) as exc:
            exc.request_index = index
            raise
        key = (item.context.tenant, item.context.request_id)
        if key in seen:
            duplicate = InvalidBatch("duplicate_request", "two requests of the batch share one request id")
            duplicate.request_index = index
            raise duplicate
        seen.add(key)
