"""`toolfence serve` with tracing on: `POST /v1/requests` is FastAPI's SERVER span (a
child of the client's `traceparent`), and the operations it registers store its trace.

A real uvicorn server in this process, tracing into the SDK's in-memory exporter
(`tracing.use`, as an application with its own provider would).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from servekit import Served
from sqlalchemy import select

from executor.http.keys import KeyScope
from executor.store.schema import operations
from executor.telemetry import tracing

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
BALANCE = {"call_id": "c1", "tool_name": "ledger.get_balance", "arguments": {"account_id": "acme-1"}}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.shutdown()
    provider.shutdown()


def _finished_with(spans: InMemorySpanExporter, name: str, timeout: float = 10.0) -> tuple[ReadableSpan, ...]:
    deadline = time.monotonic() + timeout
    while True:
        finished = spans.get_finished_spans()
        if any(span.name == name for span in finished) or time.monotonic() > deadline:
            return tuple(finished)
        time.sleep(0.02)


def test_post_requests__server_span_under_the_clients__operations_store_its_trace(
    spans: InMemorySpanExporter, served_with: Callable[..., Served]
) -> None:
    # Given a server started with tracing on, and a client inside its own trace
    served = served_with()
    key = served.key("acme", "alice", KeyScope.PRODUCE)
    body = {"calls": [BALANCE]}
    # When it posts a request
    with served.client(key) as client:
        response = client.post(
            "/v1/requests", json=body, headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
        )
    assert response.status_code == 202, response.text
    # Then the request is FastAPI's SERVER span named by its route, a child of the client's
    # (it ends once the response is sent, which the client may see first: wait for it)
    finished = _finished_with(spans, "POST /v1/requests")
    by_name = {span.name: span for span in finished}
    by_id = {span.context.span_id: span for span in finished}
    server = by_name["POST /v1/requests"]
    assert server.kind is SpanKind.SERVER
    assert f"{server.context.trace_id:032x}" == CLIENT_TRACE
    assert f"{server.parent.span_id:016x}" == CLIENT_SPAN
    assert server.attributes["http.route"] == "/v1/requests"
    assert server.attributes["http.response.status_code"] == 202
    # the producer's enqueue span is under it (FastAPI's endpoint span between)
    enqueue = by_name["toolfence.enqueue"]
    ancestors, span = [], enqueue
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        ancestors.append(span.name)
    assert ancestors[-1] == "POST /v1/requests", ancestors
    # and the operation stores the enqueue span's context: its workers join this trace
    with served.engine.connect() as conn:
        stored = conn.execute(select(operations.c.trace_context)).scalar_one()
    _, trace_id, span_id, _ = json.loads(stored)["traceparent"].split("-")
    assert (trace_id, span_id) == (CLIENT_TRACE, f"{enqueue.context.span_id:016x}")


def test_tracing_off__no_span__nothing_stored(served_with: Callable[..., Served]) -> None:
    # Given a server with tracing off (no OTEL_* variable in this test process)
    tracing.shutdown()
    assert not tracing.wanted()
    served = served_with()
    key = served.key("acme", "alice", KeyScope.PRODUCE)
    body = {"calls": [BALANCE]}
    with served.client(key) as client:
        assert client.post("/v1/requests", json=body).status_code == 202
    # Then the operation carries no trace context (and FastAPI made no span: its
    # telemetry is off with toolfence's, whatever the global provider)
    with served.engine.connect() as conn:
        assert conn.execute(select(operations.c.trace_context)).scalar_one() is None
