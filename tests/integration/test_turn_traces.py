"""A turn with tracing on: one `chat` span per model step (GenAI conventions, token
usage as attributes), children of the span that started the turn, and each step's
calls in the step's trace, down to their `execute_tool` spans.

The turn job, the operations' worker and the reconciler run in this process
(`turnkit.drive`), tracing into the SDK's in-memory exporter (`tracing.use`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import Engine
from turnkit import calls, drive, write_script

from executor.core.types import ServerContext
from executor.settings import Settings
from executor.telemetry import tracing
from executor.turns.service import start_turn
from ledger.service import Ledger
from ledger.tools import registry

ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="turn")
STEPS = [
    calls("ledger.get_balance", "c1", account_id="acme-1"),
    calls("ledger.credit", "c2", account_id="acme-2", amount_cents=500),
    {"final": "Done."},
]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.shutdown()
    provider.shutdown()


def test_turn__a_chat_span_per_step__its_calls_in_the_steps_trace(
    spans: InMemorySpanExporter, engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # Given a scripted model that reads, writes, then answers
    script = write_script(tmp_path / "turn.jsonl", STEPS)
    with engine.begin() as conn:
        turn_id = start_turn(conn, ALICE, "conv-1", "Move 5.00.", driver=f"scripted:{script}").turn_id
    # When the turn runs to its end
    assert drive(engine, settings, registry, turn_id) == "succeeded"
    finished = spans.get_finished_spans()
    by_id = {span.context.span_id: span for span in finished}

    def named(prefix: str) -> list[Any]:
        return [span for span in finished if span.name.startswith(prefix)]

    # Then every span is in the trace the turn's start began
    (started,) = named("toolfence.start_turn")
    assert {span.context.trace_id for span in finished} == {started.context.trace_id}
    # one CLIENT `chat` span per model step, each a child of the start, with its usage
    chats = sorted(named("chat"), key=lambda span: span.attributes["toolfence.step"])
    assert [span.attributes["toolfence.step"] for span in chats] == [1, 2, 3]
    for chat in chats:
        assert chat.kind is SpanKind.CLIENT
        assert chat.parent.span_id == started.context.span_id
        assert chat.name == "chat scripted"
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.response.model"] == "scripted"
        assert chat.attributes["toolfence.turn_id"] == turn_id
        assert isinstance(chat.attributes["gen_ai.usage.input_tokens"], int)
        assert isinstance(chat.attributes["gen_ai.usage.output_tokens"], int)
    # and each step's call ran under that step's chat span: tool → attempt → enqueue → chat
    for step, tool in ((1, "ledger.get_balance"), (2, "ledger.credit")):
        (tool_span,) = named(f"execute_tool {tool}")
        attempt = by_id[tool_span.parent.span_id]
        enqueue = by_id[attempt.parent.span_id]
        assert (attempt.name, enqueue.name) == ("toolfence.attempt", "toolfence.enqueue")
        assert enqueue.parent.span_id == chats[step - 1].context.span_id
