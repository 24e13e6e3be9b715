"""A retry, a reconciler sweep and its lookup join the request's trace (decision 0215),
on SQLite and PostgreSQL: the real producer, `OperationRunner` and `Reconciler` in this
process, tracing into the SDK's in-memory exporter through a provider set up as
toolfence sets up its own (derived attempt span ids: nothing written per attempt).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, select

from executor import store
from executor.core.tools import (
    Access,
    Approval,
    Effect,
    LookupAnswer,
    LookupResult,
    Mode,
    Registry,
    RetryableError,
    RetryPolicy,
    RunContext,
    Tool,
    Written,
)
from executor.core.types import ProposedCall, ServerContext
from executor.settings import Settings
from executor.store.schema import operations
from executor.telemetry import tracing
from executor.worker.runner import OperationRunner
from outbox.producer import enqueue
from reconciler.sweep import Reconciler

CTX = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="req-t")
SEEN: list[tuple[str | None, int]] = []  # (ctx.traceparent, generation) of each run


class Numbered(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


class Done(BaseModel):
    receipt: str


def _fails_first(args: Numbered, ctx: RunContext) -> Written:
    SEEN.append((ctx.traceparent, ctx.fencing_token))
    if len(SEEN) == 1:
        raise RetryableError("the downstream is unavailable")
    return Written(Done(receipt=ctx.idempotency_key), ctx.idempotency_key)


FLAKY = Tool(
    name="t.flaky", description="Fails its first call, retryably.", mode=Mode.WRITE,
    untrusted_output=False, input_model=Numbered, output_model=Done, run=_fails_first,
    access=Access.public_tool(), approval=Approval.never(), effect=[Effect.IDEMPOTENT],
    retry=RetryPolicy(max_attempts=3, initial_backoff_seconds=0.01, max_backoff_seconds=0.05),
)
LOOKED_UP: list[str | None] = []  # ctx.traceparent of each lookup


def _never_runs(args: Numbered, ctx: RunContext) -> Written:
    raise AssertionError("the test never runs it")


def _lookup(args: Numbered, ctx: RunContext) -> LookupResult:
    LOOKED_UP.append(ctx.traceparent)
    return LookupResult(LookupAnswer.DONE, Written(Done(receipt="r-1"), "r-1"))


ASKABLE = Tool(
    name="t.askable", description="A write the downstream can be asked about.", mode=Mode.WRITE,
    untrusted_output=False, input_model=Numbered, output_model=Done, run=_never_runs,
    access=Access.public_tool(), approval=Approval.never(), effect=[Effect.LOOKUP], lookup=_lookup,
)
REGISTRY = Registry([FLAKY, ASKABLE])


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    SEEN.clear()
    LOOKED_UP.clear()
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=tracing.attempt_ids())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.shutdown()
    provider.shutdown()


def _enqueued(engine: Engine, tool: str = "t.flaky") -> str:
    with engine.begin() as conn:
        handle = enqueue(conn, [ProposedCall(call_id="c1", tool_name=tool, arguments='{"n": 1}')],
                         CTX, REGISTRY)
    operation_id = handle.operation_ids["c1"]
    assert operation_id is not None
    return operation_id


def _named(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_a_retry__both_attempts_children_of_the_request__the_second_linked_to_the_first(
    spans: InMemorySpanExporter, engine: Engine, db_url: str
) -> None:
    # Given an operation enqueued inside the producer's span, whose tool fails once
    settings = Settings(database_url=db_url, broker_url="memory://")
    operation_id = _enqueued(engine)
    runner = OperationRunner(settings, REGISTRY, engine)
    # When the first attempt fails retryably and, once due, the retry runs
    assert runner.handle(operation_id).label.value == "retry_wait"
    deadline = time.monotonic() + 30
    while True:
        with engine.begin() as conn:
            if store.promote_due_retry(conn, operation_id):
                break
        assert time.monotonic() < deadline, "the retry never came due"
        time.sleep(0.05)
    assert runner.handle(operation_id).label.value == "succeeded"
    # Then both attempts are children of the enqueue span, and the second links to the first
    (request,) = _named(spans, "toolfence.enqueue")
    attempts = _named(spans, "toolfence.attempt")
    first, second = sorted(attempts, key=lambda s: s.attributes["toolfence.generation"])
    assert {first.context.trace_id, second.context.trace_id} == {request.context.trace_id}
    assert first.parent.span_id == second.parent.span_id == request.context.span_id
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert (first.attributes["toolfence.outcome"], second.attributes["toolfence.outcome"]) == (
        "retry_wait", "succeeded",
    )
    # the failed execute_tool span says so by type only
    failed, succeeded = sorted(_named(spans, "execute_tool t.flaky"), key=lambda s: s.start_time)
    assert failed.attributes["error.type"] == "RetryableError"
    assert "error.type" not in succeeded.attributes
    # each run's ctx carried its own execute_tool span's context
    assert [(tp.split("-")[2], g) for tp, g in SEEN if tp] == [
        (f"{failed.context.span_id:016x}", 1), (f"{succeeded.context.span_id:016x}", 2),
    ]
    # and nothing but the request's context was written on the row: ids are derived
    with engine.connect() as conn:
        stored = conn.execute(
            select(operations.c.trace_context).where(operations.c.operation_id == operation_id)
        ).scalar_one()
    assert set(json.loads(stored)) == {"traceparent"}


def test_a_sweep_of_an_expired_lease__in_the_trace__linked_to_the_dead_attempt(
    spans: InMemorySpanExporter, engine: Engine, db_url: str
) -> None:
    # Given an operation reserved by a worker that then died (its lease expires)
    settings = Settings(database_url=db_url, broker_url="memory://")
    operation_id = _enqueued(engine)
    with engine.begin() as conn:
        reservation = store.reserve(conn, operation_id, store.new_owner_token(), 0.2)
    assert reservation is not None and reservation.generation == 1
    time.sleep(0.5)
    # When the reconciler sweeps, and the requeued operation runs again
    report = Reconciler(settings, engine, REGISTRY).sweep()
    assert report.actions == {"requeued_stale": 1}, report.as_dict()
    SEEN.append((None, 1))  # the dead worker's call, as far as the tool's count goes
    assert OperationRunner(settings, REGISTRY, engine).handle(operation_id).label.value == "succeeded"
    # Then the sweep is in the request's trace, linked to generation 1's (never ended) attempt
    (request,) = _named(spans, "toolfence.enqueue")
    (sweep,) = _named(spans, "toolfence.reconcile")
    dead_attempt = tracing.attempt_span_id(operation_id, 1)
    assert sweep.parent.span_id == request.context.span_id
    assert [link.context.span_id for link in sweep.links] == [dead_attempt]
    assert sweep.links[0].context.trace_id == request.context.trace_id
    # and so is the next attempt, at generation 2
    (attempt,) = _named(spans, "toolfence.attempt")
    assert attempt.attributes["toolfence.generation"] == 2
    assert attempt.parent.span_id == request.context.span_id
    assert [link.context.span_id for link in attempt.links] == [dead_attempt]


def test_a_sweeps_lookup__the_downstream_gets_the_sweeps_trace_context(
    spans: InMemorySpanExporter, engine: Engine, db_url: str
) -> None:
    # Given a lookup write whose worker died holding it
    settings = Settings(database_url=db_url, broker_url="memory://")
    operation_id = _enqueued(engine, "t.askable")
    with engine.begin() as conn:
        assert store.reserve(conn, operation_id, store.new_owner_token(), 0.2) is not None
    time.sleep(0.5)
    # When the reconciler asks the downstream whether it happened
    report = Reconciler(settings, engine, REGISTRY).sweep()
    assert report.actions == {"lookup_succeeded": 1}, report.as_dict()
    # Then the lookup was made inside the sweep's span of the request's trace
    (request,) = _named(spans, "toolfence.enqueue")
    sweeps = _named(spans, "toolfence.reconcile")
    (asked,) = LOOKED_UP
    assert asked is not None
    _, trace_id, span_id, _ = asked.split("-")
    assert trace_id == f"{request.context.trace_id:032x}"
    assert span_id in {f"{sweep.context.span_id:016x}" for sweep in sweeps}
