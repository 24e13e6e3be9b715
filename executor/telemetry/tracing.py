"""OpenTelemetry traces of a request: producer → outbox → relay → worker → tool.

Off unless the standard `OTEL_*` variables ask for traces (`wanted`): an OTLP
endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`),
or `OTEL_TRACES_EXPORTER` naming `otlp` or `console`; `OTEL_SDK_DISABLED=true`
and `OTEL_TRACES_EXPORTER=none` keep it off whatever else is set. Off, no
OpenTelemetry module is imported here and every helper below answers a shared
do-nothing object after one global read (decision 0216, measured in
bench/RESULTS.md). On, a process sets up one SDK tracer provider the first time
it needs one (a Celery pool child after its fork, never the parent), named
`OTEL_SERVICE_NAME` or `toolfence-<role>`, exporting by OTLP/HTTP through a
`BatchSpanProcessor` (`OTEL_BSP_*` tune it), flushed at exit and at a worker
child's shutdown. An application that set up its own SDK provider keeps it: its
spans and ours are one trace.

The operation row is how a trace crosses processes (decision 0215): the
producer's `toolfence.enqueue` span's W3C context is stored with each operation
it registers (`trace_context`, JSON), the relay's `toolfence.publish`, each
worker's `toolfence.attempt` (reserve, re-checks, `execute_tool {tool}`,
complete) and the reconciler's `toolfence.reconcile` are its children. An
attempt's span id is derived from the operation id and its generation
(`attempt_span_id`), so the next attempt (a retry, a take-over by a new
generation) and a sweep carry a span Link to it with nothing written; only under
a provider whose ids toolfence does not choose is it stored on the row. A turn's
model steps are `chat` spans; the calls a step proposes join its trace.

Span attributes hold identifiers, names and counts, never an argument value or a
result; identifiers pass through the log sanitiser (`shown_text`) as in logs, and
an exception is recorded by its type only (its message can quote arguments).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from functools import cache
from typing import Any

log = logging.getLogger("toolfence.tracing")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
EXPORTERS = ("otlp", "console")
"""The `OTEL_TRACES_EXPORTER` values toolfence sets up (besides `none`)."""
INSTRUMENTATION = "toolfence"
COMMAND_ROLES = {"reconcile": "reconciler", "enqueue": "producer"}
"""A command's role where it is not the command's own name (`toolfence worker`: `worker`)."""

_lock = threading.Lock()
_role = "producer"
_state: Any = None  # None: not decided yet in this process; False: off; _Tracing: on
_NOTHING: AbstractContextManager[None] = nullcontext()
_ours: list[Any] = []  # the provider this module made global, once (OpenTelemetry allows one)
_PINNED: ContextVar[int | None] = ContextVar("toolfence_attempt_span_id", default=None)


def attempt_span_id(operation_id: str, generation: int) -> int:
    """The span id of generation `generation`'s attempt of an operation: derived, so the
    next attempt and a sweep can link to it with nothing written (decision 0215)."""
    digest = hashlib.sha256(f"{operation_id}\0{generation}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


@cache
def _attempt_ids_class() -> type:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class AttemptIds(RandomIdGenerator):
        """Random ids, except the span id an attempt asks for (`attempt_span_id`)."""

        def generate_span_id(self) -> int:
            pinned = _PINNED.get()
            return pinned if pinned is not None else int(super().generate_span_id())

    return AttemptIds


def attempt_ids() -> Any:
    """The SDK `IdGenerator` toolfence's providers use (give it to a provider handed
    over with `use`, or attempts store their span's context on the row instead)."""
    return _attempt_ids_class()()


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard variables in `environ` ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _exporters(environ)
    if exporters:
        # Named exporters decide: `none` is off, and so is a list of only exporters
        # toolfence does not set up (`zipkin`): spans nobody exports cost for nothing.
        return "none" not in exporters and any(name in EXPORTERS for name in exporters)
    # Spelt out (not a loop over ENDPOINT_VARIABLES): standard OTel variables, read by
    # name, which the settings package's check tells from a TOOLFENCE_* setting.
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )


def _exporters(environ: Mapping[str, str]) -> list[str]:
    return [e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]


def set_role(role: str) -> None:
    """Name this process's part (`worker`, `relay`, `serve`, `reconciler`,
    `producer`, `turn`): its default service name is `toolfence-<role>`. Called by a
    command before it traces anything; a provider already set up keeps its name."""
    global _role
    _role = role


def enabled() -> bool:
    """Whether this process traces (set up on first call when the variables ask)."""
    state = _state
    if state is None:
        state = _start()
    return state is not False


def _start() -> Any:
    global _state
    with _lock:
        if _state is None:
            _state = _Tracing.create(_role) if wanted() else False
        return _state


def after_fork() -> None:
    """In a forked child (a Celery pool process): decide again, in this process.
    (The parent sets nothing up before it forks; this keeps it so if it had.)"""
    global _state
    if _state is not None and _state is not False:
        _state.disown()
    _state = None


def use(provider: Any) -> None:
    """Trace into `provider`, an SDK `TracerProvider` its caller set up and shuts
    down (an application's own, a test's in-memory one), whatever `OTEL_*` says;
    `shutdown()` goes back to deciding from the variables."""
    global _state
    with _lock:
        _state = _Tracing(provider, owned=False)


def flush(timeout_millis: int = 10_000) -> bool:
    """Export the spans ended so far now (a producer about to exit); True when off."""
    state = _state
    if state is None or state is False:
        return True
    return bool(state.provider.force_flush(timeout_millis))


def shutdown() -> None:
    """Flush the spans still queued and stop exporting (a worker child's or a
    command's end). Safe to call when off, or twice."""
    global _state
    state, _state = _state, None
    if state is not None and state is not False:
        state.shutdown()


class _Tracing:
    """The set-up tracer of a process that traces, and the API pieces it uses."""

    def __init__(self, provider: Any, owned: bool) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from executor.core.sanitize import shown_text

        self.provider = provider
        self.owned = owned
        self.tracer = provider.get_tracer(INSTRUMENTATION)
        self.trace = trace
        self.context = context
        self.propagator = TraceContextTextMapPropagator()
        self.shown = shown_text

    @classmethod
    def create(cls, role: str) -> _Tracing:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        existing = trace.get_tracer_provider()
        if isinstance(existing, TracerProvider) and existing not in _ours:
            return cls(existing, owned=False)  # the application's own: its exporters, its names
        resource = Resource.create({"toolfence.role": role})
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: f"toolfence-{role}"}))
        provider = TracerProvider(resource=resource, id_generator=attempt_ids())
        exporters = _exporters(os.environ) or ["otlp"]
        for name in exporters:
            if name == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            elif name == "console":
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            else:
                log.warning("OTEL_TRACES_EXPORTER=%s is not one toolfence sets up (otlp, console)", name)
        if not isinstance(existing, TracerProvider):
            # The global one too, when nobody set it: a tool's own spans join ours.
            trace.set_tracer_provider(provider)
            _ours.append(provider)
        return cls(provider, owned=True)

    def disown(self) -> None:
        self.owned = False

    def shutdown(self) -> None:
        if self.owned:
            self.provider.shutdown()

    # ------------------------------------------------------------- propagation

    def carrier_of(self, span: Any) -> dict[str, str]:
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, self.trace.set_span_in_context(span))
        return carrier

    def parent(self, stored: Mapping[str, str]) -> Any:
        """The context of the stored request span (an empty context without one)."""
        return self.propagator.extract({k: stored[k] for k in ("traceparent", "tracestate") if k in stored})

    def link_to(self, traceparent: str | None, why: str) -> list[Any]:
        span = self.trace.get_current_span(self.propagator.extract({"traceparent": traceparent or ""}))
        context = span.get_span_context()
        if not context.is_valid:
            return []
        return [self.trace.Link(context, {"toolfence.link": why})]

    def previous(self, stored: Mapping[str, str], operation_id: str, generation: int, why: str) -> list[Any]:
        """A Link to generation `generation`'s attempt: the one stored on the row when its
        worker stored one, else the derived id in the request's trace; none without either."""
        if "attempt" in stored:
            return self.link_to(stored["attempt"], why)
        request = self.trace.get_current_span(self.parent(stored)).get_span_context()
        if generation < 1 or not request.is_valid:
            return []
        context = self.trace.SpanContext(
            trace_id=request.trace_id, span_id=attempt_span_id(operation_id, generation),
            is_remote=True, trace_flags=request.trace_flags,
        )
        return [self.trace.Link(context, {"toolfence.link": why})]

    def ids(self, **fields: str | int | None) -> dict[str, str | int]:
        return {
            f"toolfence.{name}": value if isinstance(value, int) else self.shown(value)
            for name, value in fields.items()
            if value is not None
        }


def _on() -> _Tracing | None:
    state = _state
    if state is None:
        state = _start()
    return state or None


def parse(stored: str | None) -> dict[str, str]:
    """A stored `trace_context` as its fields; {} for none or for anything unreadable
    (a trace context never stops an operation)."""
    if not stored:
        return {}
    try:
        value = json.loads(stored)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def stored_context() -> str | None:
    """The current span's W3C context as an operation registered now stores it
    (JSON: `traceparent`, `tracestate`); None when off or without a span."""
    tracing = _on()
    if tracing is None:
        return None
    carrier = tracing.carrier_of(tracing.trace.get_current_span())
    return json.dumps(carrier, sort_keys=True) if "traceparent" in carrier else None


def current_context() -> tuple[str | None, str | None]:
    """The current span's W3C `traceparent` and `tracestate` for a downstream call
    (a reconciler's lookup); (None, None) when off or without a span."""
    tracing = _on()
    if tracing is None:
        return None, None
    carrier = tracing.carrier_of(tracing.trace.get_current_span())
    return carrier.get("traceparent"), carrier.get("tracestate")


def current_ids() -> tuple[str, str] | None:
    """The current span's trace and span id (hex), or None (off or no span)."""
    tracing = _on()
    if tracing is None:
        return None
    context = tracing.trace.get_current_span().get_span_context()
    return (f"{context.trace_id:032x}", f"{context.span_id:016x}") if context.is_valid else None


# ------------------------------------------------------------------ the producer


def enqueue_span(tenant: str, request_id: str, calls: int) -> AbstractContextManager[None]:
    """The producer's span of one `enqueue` (a child of the caller's span, such as
    `POST /v1/requests`): the operations it registers store its context."""
    tracing = _on()
    if tracing is None:
        return _NOTHING
    attributes = {**tracing.ids(tenant=tenant, request_id=request_id), "toolfence.calls": calls}
    return _current_span(tracing, "toolfence.enqueue", attributes)


@contextmanager
def _current_span(
    tracing: _Tracing, name: str, attributes: Mapping[str, Any], *, kind: str = "INTERNAL",
    parent: Any = None, links: list[Any] | None = None,
) -> Iterator[None]:
    with tracing.tracer.start_as_current_span(
        name, context=parent, kind=getattr(tracing.trace.SpanKind, kind), attributes=attributes,
        links=links, record_exception=False, set_status_on_exception=False,
    ) as span:
        try:
            yield
        except BaseException as exc:
            _failed(tracing, span, exc)
            raise


def _failed(tracing: _Tracing, span: Any, exc: BaseException) -> None:
    """An exception by its type only: its message can quote an argument."""
    span.set_attribute("error.type", type(exc).__qualname__)
    span.set_status(tracing.trace.Status(tracing.trace.StatusCode.ERROR))


def fastapi_telemetry() -> dict[str, Any]:
    """`FastAPI(telemetry=…)` for `toolfence serve`: FastAPI's own SERVER span per
    request (a child of the client's `traceparent`, named by method and route) and
    its operation spans, into this process's provider when tracing is on; nothing
    when off. Never its metrics (Prometheus counts requests) nor its exception logs
    (a validation error's message can quote the body)."""
    tracing = _on()
    return {
        "tracing": tracing is not None,
        "tracer_provider": None if tracing is None else tracing.provider,
        "metrics": False, "logs": False, "auto_configure": False,
    }


# ------------------------------------------------------------------ turns


def turn_span(tenant: str, turn_id: str) -> AbstractContextManager[None]:
    """Starting a turn (a child of the caller's span, such as `POST /v1/turns`): the
    turn stores its context, and each of its model steps is a child of it."""
    tracing = _on()
    if tracing is None:
        return _NOTHING
    return _current_span(tracing, "toolfence.start_turn", tracing.ids(tenant=tenant, turn_id=turn_id))


def chat_span(stored: str | None, turn_id: str, step: int, driver: Any) -> NoSpan | Chat:
    """One model step of a turn (GenAI's `chat`, CLIENT): a child of the span that
    started the turn; `answered(usage)` names its model and token usage, `stored` is
    the context the step keeps for its calls."""
    tracing = _on()
    if tracing is None:
        return NO_SPAN
    return Chat(tracing, stored, turn_id, step, driver)


def resumed(stored: str | None) -> AbstractContextManager[None]:
    """`stored`'s span current again, with no new span (a step's calls enqueued by a
    later job join the step's `chat` span)."""
    tracing = _on()
    if tracing is None or not stored:
        return _NOTHING
    return _attached(tracing, tracing.parent(parse(stored)))


@contextmanager
def _attached(tracing: _Tracing, context: Any) -> Iterator[None]:
    token = tracing.context.attach(context)
    try:
        yield
    finally:
        tracing.context.detach(token)


class Chat:
    def __init__(self, tracing: _Tracing, stored: str | None, turn_id: str, step: int, driver: Any) -> None:
        self.tracing = tracing
        mode = str(getattr(driver, "mode", ""))
        model = getattr(driver, "model", None)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat", **tracing.ids(turn_id=turn_id, step=step),
        }
        if mode and mode != "json":
            attributes["gen_ai.provider.name"] = mode
        if isinstance(model, str) and model:
            attributes["gen_ai.request.model"] = tracing.shown(model)
        self.span = tracing.tracer.start_span(
            "chat", context=tracing.parent(parse(stored)), kind=tracing.trace.SpanKind.CLIENT,
            attributes=attributes,
        )
        self.stored: str | None = json.dumps(tracing.carrier_of(self.span), sort_keys=True)
        self._token: Any = None

    def __enter__(self) -> Chat:
        self._token = self.tracing.context.attach(self.tracing.trace.set_span_in_context(self.span))
        return self

    def answered(self, usage: Any) -> None:
        """The model's answer: its model's name and token counts (never its text)."""
        model = self.tracing.shown(str(usage.model)) if usage.model else ""
        if model:
            self.span.update_name(f"chat {model}")
            self.span.set_attribute("gen_ai.response.model", model)
        self.span.set_attribute("gen_ai.usage.input_tokens", int(usage.input_tokens))
        self.span.set_attribute("gen_ai.usage.output_tokens", int(usage.output_tokens))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object) -> None:
        if exc is not None:
            _failed(self.tracing, self.span, exc)
        self.span.end()
        self.tracing.context.detach(self._token)


# ------------------------------------------------------------------ the relay


def publish_span(operation_id: str, stored: str | None) -> AbstractContextManager[None]:
    """The relay's publish of one operation's message: a child of its request span."""
    tracing = _on()
    if tracing is None:
        return _NOTHING
    attributes = {
        **tracing.ids(operation_id=operation_id),
        "messaging.operation.type": "publish",
        "messaging.system": "celery",
    }
    return _current_span(
        tracing, "toolfence.publish", attributes, kind="PRODUCER", parent=tracing.parent(parse(stored))
    )


# ------------------------------------------------------------------ the reconciler


def reconcile_span(operation_id: str, generation: int, stored: str | None) -> AbstractContextManager[None]:
    """A sweep settling one stale operation: a child of its request span, linked to the
    last attempt's span (the one whose lease expired)."""
    tracing = _on()
    if tracing is None:
        return _NOTHING
    fields = parse(stored)
    return _current_span(
        tracing, "toolfence.reconcile", tracing.ids(operation_id=operation_id, generation=generation),
        parent=tracing.parent(fields),
        links=tracing.previous(fields, operation_id, generation, "last_attempt"),
    )


# ------------------------------------------------------------------ the worker


class NoSpan:
    """What an execution's tracing answers when off: every call does nothing."""

    traceparent: str | None = None
    tracestate: str | None = None
    stored: str | None = None

    def __enter__(self) -> NoSpan:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def tool(self, tool_name: str, call_id: str) -> NoSpan:
        return self

    def outcome(self, label: str) -> None:
        return None

    def answered(self, usage: Any) -> None:
        return None


NO_SPAN = NoSpan()


def attempt(
    row: Any, generation: int, took_over: bool, reserve_sent_at: float, save: Callable[[str], None]
) -> NoSpan | Attempt:
    """One execution attempt of an operation whose reservation won (`row`, the
    operation as read; `reserve_sent_at`, `time.monotonic()` when the reservation
    was sent): a context manager whose span is current while it runs. `save` stores
    the text given to it on the row (the request's context and this attempt's)."""
    tracing = _on()
    if tracing is None:
        return NO_SPAN
    return Attempt(tracing, row, generation, took_over, reserve_sent_at, save)


class Attempt:
    """`toolfence.attempt` (CONSUMER, child of the request span, linked to the
    previous attempt's span), with its phases as children: `toolfence.reserve`
    (from when the reservation was sent), `toolfence.recheck`, `execute_tool
    {tool}` (current while the tool runs) and `toolfence.complete`."""

    def __init__(
        self, tracing: _Tracing, row: Any, generation: int, took_over: bool, reserve_sent_at: float,
        save: Callable[[str], None],
    ) -> None:
        self.tracing = tracing
        self.row = row
        self.generation = generation
        self.took_over = took_over
        self.started_ns = time.time_ns() - int((time.monotonic() - reserve_sent_at) * 1e9)
        self.save = save
        self.ids = tracing.ids(
            operation_id=row.operation_id, request_id=row.request_id, generation=generation,
        )
        self._phase: Any = None
        self._token: Any = None

    def __enter__(self) -> Attempt:
        tracing, trace = self.tracing, self.tracing.trace
        stored = parse(self.row.trace_context)
        parent = tracing.parent(stored)
        derived = attempt_span_id(self.row.operation_id, self.generation)
        links = tracing.previous(stored, self.row.operation_id, self.generation - 1, "previous_attempt")
        pinned = _PINNED.set(derived)
        try:
            self.span = tracing.tracer.start_span(
                "toolfence.attempt", context=parent, kind=trace.SpanKind.CONSUMER,
                attributes={**self.ids, "toolfence.took_over": self.took_over},
                links=links, start_time=self.started_ns,
            )
        finally:
            _PINNED.reset(pinned)
        self.context = trace.set_span_in_context(self.span)
        self._token = tracing.context.attach(self.context)
        tracing.tracer.start_span(
            "toolfence.reserve", context=self.context, start_time=self.started_ns, attributes=self.ids,
        ).end()
        mine: dict[str, str] = {}  # the request's context as read (nothing when unreadable)
        tracing.propagator.inject(mine, parent)
        if "traceparent" not in mine or self.span.get_span_context().span_id != derived:
            # The next attempt cannot derive this span: an application's provider chose
            # its id, or there is no request trace to find it in. Stored on the row.
            self._store(mine)
        self._begin("toolfence.recheck")
        return self

    def _store(self, mine: dict[str, str]) -> None:
        mine["attempt"] = self.tracing.carrier_of(self.span)["traceparent"]
        try:
            self.save(json.dumps(mine, sort_keys=True))
        except Exception as exc:  # a trace context never stops an operation
            log.warning("could not store the trace context of %s: %s", self.row.operation_id,
                        type(exc).__name__)

    def _begin(self, name: str | None) -> None:
        if self._phase is not None:
            self._phase.end()
        self._phase = None if name is None else self.tracing.tracer.start_span(
            name, context=self.context, attributes=self.ids,
        )

    def tool(self, tool_name: str, call_id: str) -> ToolSpan:
        """The re-checks passed: the tool's span, started now, current inside `with`."""
        self._begin(None)
        return ToolSpan(self, tool_name, call_id)

    def outcome(self, label: str) -> None:
        self.span.set_attribute("toolfence.outcome", label)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object) -> None:
        self._begin(None)
        if exc is not None:
            _failed(self.tracing, self.span, exc)
        self.span.end()
        self.tracing.context.detach(self._token)


class ToolSpan:
    """`execute_tool {tool}` (GenAI semantic conventions): its W3C context is what the
    tool's `ctx` and an MCP call's `_meta` carry downstream."""

    def __init__(self, attempt: Attempt, tool_name: str, call_id: str) -> None:
        tracing = attempt.tracing
        self.attempt = attempt
        self.span = tracing.tracer.start_span(
            f"execute_tool {tool_name}", context=attempt.context,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tracing.shown(tool_name),
                "gen_ai.tool.call.id": tracing.shown(call_id),
                **attempt.ids,
            },
        )
        carrier = tracing.carrier_of(self.span)
        self.traceparent: str | None = carrier.get("traceparent")
        self.tracestate: str | None = carrier.get("tracestate")
        self._token: Any = None

    def __enter__(self) -> ToolSpan:
        tracing = self.attempt.tracing
        self._token = tracing.context.attach(tracing.trace.set_span_in_context(self.span))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object) -> None:
        tracing = self.attempt.tracing
        if exc is not None:
            _failed(tracing, self.span, exc)
        self.span.end()
        tracing.context.detach(self._token)
        self.attempt._begin("toolfence.complete")
