"""Tracing (executor/telemetry/tracing.py): when it is on, what each span holds, how the
context travels through a stored `trace_context`, and that off costs no import.

Spans are read from the SDK's in-memory exporter, through a provider handed over with
`tracing.use` (as an application that set up its own provider would).
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from executor.telemetry import logs, tracing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "sk-tracingSECRETtracingSECRET0123456789"


def _tracing_into(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.shutdown()
    provider.shutdown()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A provider as toolfence sets one up: attempts' span ids are derived."""
    yield from _tracing_into(TracerProvider(id_generator=tracing.attempt_ids()))


@pytest.fixture
def foreign_spans() -> Iterator[InMemorySpanExporter]:
    """An application's own provider: random span ids everywhere."""
    yield from _tracing_into(TracerProvider())


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


def _row(stored: str | None, generation: int = 1) -> SimpleNamespace:
    return SimpleNamespace(operation_id="op-1", request_id="req-1", trace_context=stored)


def _run_attempt(row: SimpleNamespace, generation: int, saved: list[str], fail: bool = False) -> str | None:
    with tracing.attempt(row, generation, generation > 1, reserve_sent_at=0.0, save=saved.append) as trace:
        tool = trace.tool("ledger.transfer", "call-7")
        traceparent = tool.traceparent
        try:
            with tool:
                if fail:
                    raise ValueError(f"the downstream said {SECRET}")
        except ValueError:
            pass
        trace.outcome("completed")
    return traceparent


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_TRACES_EXPORTER": "zipkin", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_TRACES_EXPORTER": "zipkin,otlp"}, True),
    ],
)
def test_wanted__only_the_standard_variables_turn_traces_on(environ: dict[str, str], on: bool) -> None:
    assert tracing.wanted(environ) is on


def test_off__no_opentelemetry_sdk_import__every_helper_answers_the_shared_do_nothing() -> None:
    # Given a process with no OTEL_* variable
    code = (
        "import sys, types\n"
        "from executor.telemetry import tracing\n"
        "row = types.SimpleNamespace(operation_id='o', request_id='r', trace_context=None)\n"
        "assert tracing.enabled() is False\n"
        "assert tracing.attempt(row, 1, False, 0.0, print) is tracing.NO_SPAN\n"
        "assert tracing.NO_SPAN.tool('t', 'c').traceparent is None\n"
        "assert tracing.stored_context() is None and tracing.current_ids() is None\n"
        "assert tracing.current_context() == (None, None)\n"
        "with tracing.enqueue_span('t', 'r', 1), tracing.publish_span('o', None):\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = ROOT
    # When it runs every helper
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    # Then each answered "off" and the SDK was never imported
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_attempts__children_of_the_request_span__a_new_generation_links_to_the_last(spans) -> None:
    # Given an operation registered inside the producer's enqueue span
    with tracing.enqueue_span("acme", "req-1", 1):
        stored = tracing.stored_context()
    assert stored is not None
    # When generation 1 runs and generation 2 takes over
    saved: list[str] = []
    first_traceparent = _run_attempt(_row(stored), 1, saved)
    second_traceparent = _run_attempt(_row(stored), 2, saved)
    # Then every span is in the request's trace
    found = _by_name(spans)
    enqueue = found["toolfence.enqueue"][0]
    trace_id = enqueue.context.trace_id
    assert {span.context.trace_id for span in spans.get_finished_spans()} == {trace_id}
    first, second = found["toolfence.attempt"]
    # each attempt a child of the request span, a consumer
    assert first.parent.span_id == second.parent.span_id == enqueue.context.span_id
    assert first.kind is second.kind is SpanKind.CONSUMER
    # generation 2 linked to generation 1's attempt, and only it
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert second.links[0].attributes["toolfence.link"] == "previous_attempt"
    assert first.links == ()
    assert (first.attributes["toolfence.generation"], second.attributes["toolfence.generation"]) == (1, 2)
    assert second.attributes["toolfence.took_over"] is True
    assert first.attributes["toolfence.outcome"] == "completed"
    # the phases are children of their attempt
    phases = ("toolfence.reserve", "toolfence.recheck", "execute_tool ledger.transfer", "toolfence.complete")
    for name in phases:
        assert [span.parent.span_id for span in found[name]] == [
            first.context.span_id, second.context.span_id,
        ], name
    # each attempt's span id is derived from (operation, generation): nothing was stored
    assert saved == []
    assert first.context.span_id == tracing.attempt_span_id("op-1", 1)
    assert second.context.span_id == tracing.attempt_span_id("op-1", 2)
    # and the traceparent handed to the tool is the execute_tool span's own
    tool_spans = found["execute_tool ledger.transfer"]
    for traceparent, span in zip((first_traceparent, second_traceparent), tool_spans, strict=True):
        assert traceparent is not None
        ids = ["00", f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"]
        assert traceparent.split("-")[:3] == ids


def test_an_applications_provider__the_attempt_stores_its_context__the_next_links_through_it(
    foreign_spans,
) -> None:
    # Given an application's own provider (its ids are random, so not derivable)
    with tracing.enqueue_span("acme", "req-1", 1):
        stored = tracing.stored_context()
    # When two generations run
    saved: list[str] = []
    _run_attempt(_row(stored), 1, saved)
    _run_attempt(_row(saved[-1]), 2, saved)
    # Then each stored the request's context and its own, and the second linked to the first
    first, second = _by_name(foreign_spans)["toolfence.attempt"]
    assert len(saved) == 2
    assert json.loads(saved[-1])["traceparent"] == json.loads(stored)["traceparent"]
    assert json.loads(saved[-1])["attempt"].split("-")[2] == f"{second.context.span_id:016x}"
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert second.parent.span_id == first.parent.span_id


def test_execute_tool__genai_attributes__a_failure_by_its_type_only(spans) -> None:
    # Given an attempt whose tool raises with a secret in its message
    _run_attempt(_row(None), 1, [], fail=True)
    # Then the tool span follows the GenAI conventions and says only the type
    (tool,) = _by_name(spans)["execute_tool ledger.transfer"]
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "ledger.transfer"
    assert tool.attributes["gen_ai.tool.call.id"] == "call-7"
    assert tool.attributes["toolfence.operation_id"] == "op-1"
    assert tool.attributes["toolfence.request_id"] == "req-1"
    assert tool.status.status_code is StatusCode.ERROR
    assert tool.attributes["error.type"] == "ValueError"
    assert tool.events == ()
    assert SECRET not in repr([(s.attributes, s.status.description) for s in spans.get_finished_spans()])
    # and with no stored context the attempt is a root, linked to nothing
    (attempt,) = _by_name(spans)["toolfence.attempt"]
    assert attempt.parent is None and attempt.links == ()


def test_identifiers_in_attributes__sanitised_as_in_logs(spans) -> None:
    with tracing.enqueue_span("acme", f"req-{SECRET}", 1):
        pass
    (span,) = spans.get_finished_spans()
    assert SECRET not in str(span.attributes["toolfence.request_id"])
    assert span.attributes["toolfence.calls"] == 1


@pytest.mark.parametrize("stored", ["not json", "[1, 2]", '{"traceparent": 7}', '{"traceparent": "00-zz"}'])
def test_unreadable_stored_context__the_attempt_still_runs_as_a_root(spans, stored: str) -> None:
    saved: list[str] = []
    _run_attempt(_row(stored), 2, saved)
    (attempt,) = _by_name(spans)["toolfence.attempt"]
    assert attempt.parent is None and attempt.links == ()
    assert set(json.loads(saved[0])) == {"attempt"}


def test_a_failing_save__logged__the_attempt_goes_on(spans, caplog) -> None:
    def save(text: str) -> None:
        raise ConnectionError("the database went away")

    with (
        caplog.at_level(logging.WARNING, "toolfence.tracing"),
        tracing.attempt(_row(None), 1, False, 0.0, save) as trace,
    ):
        trace.outcome("completed")
    assert "ConnectionError" in caplog.text
    assert [span.name for span in spans.get_finished_spans()][-1] == "toolfence.attempt"


def test_publish_and_reconcile__children_of_the_request__the_sweep_links_to_the_last_attempt(spans) -> None:
    with tracing.enqueue_span("acme", "req-1", 1):
        stored = tracing.stored_context()
    _run_attempt(_row(stored), 1, [])
    with tracing.publish_span("op-1", stored):
        pass
    with tracing.reconcile_span("op-1", 1, stored):
        pass
    found = _by_name(spans)
    enqueue, attempt = found["toolfence.enqueue"][0], found["toolfence.attempt"][0]
    (publish,), (sweep,) = found["toolfence.publish"], found["toolfence.reconcile"]
    assert publish.kind is SpanKind.PRODUCER
    assert publish.parent.span_id == sweep.parent.span_id == enqueue.context.span_id
    assert [link.context.span_id for link in sweep.links] == [attempt.context.span_id]


def test_current_context__the_current_spans_traceparent__none_outside_a_span(spans) -> None:
    assert tracing.current_context() == (None, None)
    with tracing.enqueue_span("acme", "req-1", 1):
        traceparent, tracestate = tracing.current_context()
    (span,) = spans.get_finished_spans()
    assert traceparent is not None and tracestate is None
    assert traceparent.split("-")[1:3] == [f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"]


def test_json_logs__a_record_inside_a_span_carries_its_trace_and_span_ids(spans) -> None:
    # Given the JSON handler toolfence installs for TOOLFENCE_LOG_FORMAT=json
    stream = io.StringIO()
    logger = logging.getLogger("toolfence.test_tracing")
    handler = logs.json_handler(stream)
    logger.addHandler(handler)
    try:
        # When a record is logged inside the tool's span, and one outside any
        saved: list[str] = []
        with tracing.attempt(_row(None), 1, False, 0.0, saved.append) as trace, trace.tool("t", "c"):
            logger.warning("inside")
            ids = tracing.current_ids()
        logger.warning("outside")
    finally:
        logger.removeHandler(handler)
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    # Then the first names the span (as `traceparent` writes the ids), the second none
    assert ids is not None
    assert (inside["trace_id"], inside["span_id"]) == ids
    (tool,) = _by_name(spans)["execute_tool t"]
    assert inside["span_id"] == f"{tool.context.span_id:016x}"
    assert "trace_id" not in outside and "span_id" not in outside
