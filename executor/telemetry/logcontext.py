"""The correlation ids of what a process is doing now, for its log records.

A worker sets them around an operation's execution (request, operation, call,
generation, tenant, tool), around a turn (turn, step), the relay around a
publish, the reconciler around a sweep item, `toolfence serve` around an HTTP
request. They live in a `ContextVar`, so each thread and each asyncio task sees
its own, and `CorrelationFilter` copies them onto every record a handler emits;
the JSON formatter (`executor.telemetry.logs`) writes them as fields.

Only identifiers and small integers go here, never an argument value: a log
line is read by people and pipelines that may not see the operation's data.
Identifiers an application chose (a request id) can still hold a secret, so the
formatter passes them through the sanitiser too.

When OpenTelemetry's API is importable and a span is active, the filter adds its
`trace_id` and `span_id`: a tracer set up later joins its traces to these logs
with nothing else to change here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from types import MappingProxyType

FIELDS: tuple[str, ...] = (
    "request_id",
    "operation_id",
    "call_id",
    "generation",
    "tenant",
    "tool",
    "turn_id",
    "step",
    "http_request_id",
)
"""The fields a scope may set, in the order a JSON record shows them."""
TRACE_FIELDS: tuple[str, ...] = ("trace_id", "span_id")
"""What the active OpenTelemetry span adds, when there is one."""

Value = str | int | None
_EMPTY: Mapping[str, str | int] = MappingProxyType({})
_FIELDS: ContextVar[Mapping[str, str | int]] = ContextVar("toolfence_log_fields", default=_EMPTY)


def _merged(fields: Mapping[str, Value]) -> Mapping[str, str | int]:
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise TypeError(f"not a correlation field: {', '.join(sorted(unknown))}")
    merged = dict(_FIELDS.get())
    merged.update({name: value for name, value in fields.items() if value is not None})
    return MappingProxyType(merged)


def open_scope(**fields: Value) -> Token[Mapping[str, str | int]]:
    """Add `fields` until `close_scope(token)`; for a caller whose start and end are
    two callbacks (Celery's task_prerun and task_postrun), not one block."""
    return _FIELDS.set(_merged(fields))


def close_scope(token: Token[Mapping[str, str | int]]) -> None:
    """Back to the fields before `open_scope`, whatever `bind` added since."""
    _FIELDS.reset(token)


@contextmanager
def log_context(**fields: Value) -> Iterator[None]:
    """`fields` on every record logged in this block (a None value is not known yet,
    and leaves the field as it was); the block's end removes them, and whatever
    `bind` added inside it."""
    token = open_scope(**fields)
    try:
        yield
    finally:
        close_scope(token)


def bind(**fields: Value) -> None:
    """Add `fields` to the innermost scope, as they become known (the generation once
    the reservation won); the scope's end removes them."""
    _FIELDS.set(_merged(fields))


def current() -> Mapping[str, str | int]:
    """The fields known here now."""
    return _FIELDS.get()


def _no_trace() -> Mapping[str, str]:
    return _EMPTY  # type: ignore[return-value]


def trace_ids_reader() -> Callable[[], Mapping[str, str]]:
    """A function answering the active span's `trace_id` and `span_id` (hex, as
    OpenTelemetry writes them in `traceparent`), or nothing without one; without
    OpenTelemetry's API installed, always nothing."""
    try:
        from opentelemetry import trace
    except ImportError:
        return _no_trace

    def read() -> Mapping[str, str]:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return _EMPTY  # type: ignore[return-value]
        return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}

    return read


class CorrelationFilter(logging.Filter):
    """Copies the correlation ids known where a record is logged onto it, as
    attributes (`record.operation_id`, …); a field the call gave as `extra` stays.
    Attached to a handler, so every logger's records get them, a library's too."""

    def __init__(self) -> None:
        super().__init__()
        self._trace_ids = trace_ids_reader()

    def filter(self, record: logging.LogRecord) -> bool:
        for fields in (_FIELDS.get(), self._trace_ids()):
            for name, value in fields.items():
                if name not in record.__dict__:
                    setattr(record, name, value)
        return True
