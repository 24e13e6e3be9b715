"""One trace per request across processes: producer → relay → worker → tool, and a
SIGKILLed worker's successor linked to it (docs/tracing.md, decisions 0215 and 0216).

Every process exports by OTLP/HTTP to a receiver this test starts
(`otlpkit.otlp_receiver`); what is asserted is decoded from the protobuf the
processes sent, and the raw bytes are searched for the canary argument value.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from canary_tools import CANARY
from fleetkit import call, context, enqueue_committed, operation, owner_pid, wait_until, worker_of
from otlpkit import ReceivedSpan, Receiver, otlp_receiver

from executor.cli.fleet import Fleet, process_alive
from executor.mcp import shutdown_connections
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.telemetry import tracing
from ledger.service import Ledger
from outbox.results import wait_for_results
from tests.fixtures.mcp_trace_tools import build

ROOT = Path(__file__).resolve().parents[2]
TRANSFER = {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 700}
PRODUCER, CONSUMER = 4, 5  # OTLP's SPAN_KIND_PRODUCER and SPAN_KIND_CONSUMER
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """The receiver, and this (producer) process tracing into it."""
    with otlp_receiver() as received:
        for name, value in _otel_env(received).items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        tracing.shutdown()
        tracing.set_role("producer")
        yield received
        tracing.shutdown()


def _otel_env(received: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": received.endpoint,
        # Ended spans leave within 0.2 s: a SIGKILLed worker's already-ended ones arrive.
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_TRACES_SAMPLER": "always_on",
    }


def _names(spans: list[ReceivedSpan]) -> set[tuple[str, str]]:
    return {(span.service, span.name) for span in spans}


def _one(spans: list[ReceivedSpan], name: str, **attributes: object) -> ReceivedSpan:
    found = [
        s for s in spans if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]
    assert len(found) == 1, (name, attributes, [(s.service, s.name, s.attributes) for s in spans])
    return found[0]


def test_one_trace__producer_relay_worker_and_tool__mcp_gets_traceparent__no_canary(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet], receiver: Receiver
) -> None:
    # Given a fleet whose every process exports to the receiver, with JSON logs
    fleet = make_fleet(
        workers=1,
        env={
            **_otel_env(receiver),
            "TOOLFENCE_TOOLS": "tests.fixtures.mcp_trace_tools:build",
            "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "tests" / "fleet"))),
            "TOOLFENCE_LOG_FORMAT": "json",
            "TOOLFENCE_LOG_LEVEL": "info",
        },
    ).start()
    registry = build()
    shutdown_connections()
    engine = make_engine(settings.database_url)
    ctx = context("req-trace")
    calls = [
        call("m1", "fx.store", key="k1", value=CANARY),
        call("c1", "ledger.credit", account_id="acme-2", amount_cents=5, memo=CANARY),
    ]
    # When the producer enqueues a request (in this process) and the fleet runs it
    with engine.begin() as conn:
        from outbox.producer import enqueue

        handle = enqueue(conn, calls, ctx, registry)
    statuses = {s.call_id: s for s in wait_for_results(engine, "acme", "req-trace", timeout=60)}
    assert {k: s.status for k, s in statuses.items()} == {"m1": "succeeded", "c1": "succeeded"}, fleet.logs()
    assert tracing.flush()

    # Then one trace id spans the producer, the relay, the worker and each tool
    enqueue_span = _one(receiver.spans(), "toolfence.enqueue")
    trace_id = enqueue_span.trace_id
    wanted = {
        ("toolfence-producer", "toolfence.enqueue"),
        ("toolfence-relay", "toolfence.publish"),
        ("toolfence-worker", "toolfence.attempt"),
        ("toolfence-worker", "toolfence.reserve"),
        ("toolfence-worker", "toolfence.recheck"),
        ("toolfence-worker", "execute_tool fx.store"),
        ("toolfence-worker", "execute_tool ledger.credit"),
        ("toolfence-worker", "toolfence.complete"),
    }

    def arrived() -> bool:
        spans = receiver.of_trace(trace_id)
        each = {(s.name, s.attributes.get("toolfence.operation_id")) for s in spans}
        return wanted <= _names(spans) and all(
            (name, operation_id) in each
            for operation_id in handle.operation_ids.values()
            for name in ("toolfence.publish", "toolfence.attempt", "toolfence.complete")
        )

    wait_until(arrived, timeout=30,
               what="every process's spans in the request's trace",
               show=lambda: sorted(_names(receiver.of_trace(trace_id))))
    spans = receiver.of_trace(trace_id)
    for call_id, tool in (("m1", "fx.store"), ("c1", "ledger.credit")):
        operation_id = handle.operation_ids[call_id]
        # (a loaded machine can leave it queued long enough for the reconciler to
        # republish it: each publish is a span of the trace, and only one attempt runs)
        publishes = [
            span for span in spans
            if span.name == "toolfence.publish" and span.attributes["toolfence.operation_id"] == operation_id
        ]
        attempt = _one(spans, "toolfence.attempt", **{"toolfence.operation_id": operation_id})
        tool_span = _one(spans, f"execute_tool {tool}")
        # the relay's publish and the worker's attempt are children of the request span
        assert publishes and all(p.parent_span_id == enqueue_span.span_id for p in publishes)
        assert all(p.kind == PRODUCER and p.service == "toolfence-relay" for p in publishes)
        assert attempt.parent_span_id == enqueue_span.span_id
        assert attempt.kind == CONSUMER and attempt.attributes["toolfence.generation"] == 1
        # the tool's span: GenAI's execute_tool, a child of its attempt
        assert tool_span.parent_span_id == attempt.span_id
        assert tool_span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert tool_span.attributes["gen_ai.tool.name"] == tool
        assert tool_span.attributes["gen_ai.tool.call.id"] == call_id
        assert tool_span.attributes["toolfence.request_id"] == "req-trace"
    # and the MCP server received, in `_meta`, the context of the execute_tool span or
    # of the MCP SDK's own client span under it (the SDK injects its span's over ours)
    mcp_span = _one(spans, "execute_tool fx.store")
    sent = set(TRACEPARENT.findall(json.dumps(statuses["m1"].output)))  # type: ignore[attr-defined]
    assert len(sent) == 1, statuses["m1"]
    ((sent_trace, sent_span),) = sent
    by_id = {span.span_id: span for span in spans}
    assert sent_trace == trace_id
    assert sent_span == mcp_span.span_id or by_id[sent_span].parent_span_id == mcp_span.span_id
    # the resource names each process's part
    assert {s.resource.get("toolfence.role") for s in spans} == {"producer", "relay", "worker"}
    # no argument value left any process in a span
    assert all(CANARY.encode() not in body for body in receiver.bodies())
    # and the JSON log lines written inside a span carry its trace id
    lines = [json.loads(line[line.index("{"):]) for line in fleet.logs().splitlines() if '"trace_id"' in line]
    assert any(line.get("trace_id") == trace_id and "span_id" in line for line in lines), fleet.logs()


def test_sigkilled_worker__successor_attempt_links_to_it__same_trace(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet], receiver: Receiver
) -> None:
    # Given two workers and a reconciler tracing, and a fenced transfer that stays in
    # its downstream call long enough to strike
    fleet = make_fleet(
        workers=2, concurrency=1, reconcile_every=0.5,
        env={**_otel_env(receiver), "TOOLFENCE_LEDGER_LATENCY_MS": "3000"},
    ).start()
    engine = make_engine(settings.database_url)
    handle = enqueue_committed(engine, [call("t", "ledger.transfer", **TRANSFER)], context("req-kill"))
    operation_id = handle.operation_ids["t"]
    assert tracing.flush()
    enqueue_span = _one(receiver.spans(), "toolfence.enqueue")

    # When the pool child running it is SIGKILLed in the middle of the tool
    def first_reserve() -> list[ReceivedSpan]:
        return [s for s in receiver.of_trace(enqueue_span.trace_id)
                if s.name == "toolfence.reserve" and s.attributes.get("toolfence.generation") == 1]

    # (its reserve span ended when the attempt began, so it is exported before the kill)
    wait_until(first_reserve, timeout=60, what="generation 1's reserve span")
    wait_until(lambda: owner_pid(engine, operation_id) is not None, timeout=30, what="an owner")
    victim = owner_pid(engine, operation_id)
    assert victim is not None and victim != worker_of(fleet, victim).pid
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not process_alive(victim), timeout=10, what="the pool child to die")

    # Then a later generation completes it
    wait_until(lambda: operation(engine, operation_id).state == "succeeded", timeout=90,
               what="the operation to succeed")
    final = operation(engine, operation_id)
    assert final.generation >= 2

    # and its attempt is in the same trace, a child of the request span, linked to the
    # killed attempt's span (the parent of the killed worker's exported reserve span)
    def successor() -> list[ReceivedSpan]:
        return [
            s for s in receiver.of_trace(enqueue_span.trace_id)
            if s.name == "toolfence.attempt" and s.attributes.get("toolfence.generation") == final.generation
        ]

    wait_until(successor, timeout=30, what="the successor's attempt span")
    (killed_reserve,) = first_reserve()
    killed_attempt_id = killed_reserve.parent_span_id
    # (derived from the operation and its generation: nothing was written for it)
    assert killed_attempt_id == f"{tracing.attempt_span_id(operation_id, 1):016x}"
    attempts = {
        s.attributes["toolfence.generation"]: s for s in receiver.of_trace(enqueue_span.trace_id)
        if s.name == "toolfence.attempt"
    }
    # (the killed attempt never ended, so its span never left its process)
    assert 1 not in attempts, attempts
    second = attempts[2]
    assert second.parent_span_id == enqueue_span.span_id and second.service == "toolfence-worker"
    assert [(t, s) for t, s, _ in second.links] == [(enqueue_span.trace_id, killed_attempt_id)]
    assert second.links[0][2] == {"toolfence.link": "previous_attempt"}
    # and whoever moved it on is in the trace: the successor took the expired lease
    # over itself, or the reconciler requeued it, in a span linked to the killed attempt
    sweeps = [s for s in receiver.of_trace(enqueue_span.trace_id) if s.name == "toolfence.reconcile"]
    assert sweeps or second.attributes["toolfence.took_over"] is True, attempts
    for sweep in sweeps:
        assert sweep.service == "toolfence-reconciler"
        assert sweep.parent_span_id == enqueue_span.span_id
        assert [span_id for _, span_id, _ in sweep.links] == [killed_attempt_id]
