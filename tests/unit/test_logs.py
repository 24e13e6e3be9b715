"""JSON logs (TOOLFENCE_LOG_FORMAT=json): the formatter, the correlation ids, the
level and format settings, and a real `toolfence` process writing JSON lines.

The fleet's own processes (worker and its pool children, relay, reconciler,
exporter) are covered by tests/fleet/test_fleet_canary.py, which runs its fleet
in both formats and scans every line for the canary."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executor.telemetry import logcontext, logs
from executor.telemetry.jsonlines import MESSAGE_MAX_CHARS
from executor.telemetry.logcontext import CorrelationFilter, bind, log_context

SECRET = "sk-logsCANARYlogsCANARYlogs0123456789"
Lines = tuple[logging.Logger, io.StringIO]


@pytest.fixture
def lines() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing JSON lines (handler, formatter and filter as `configure`
    sets them up) to a buffer, detached from the root logger."""
    stream = io.StringIO()
    logger = logging.getLogger("toolfence.test_logs")
    handler = logs.json_handler(stream)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def records(stream: io.StringIO) -> list[dict[str, Any]]:
    text = stream.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


# ------------------------------------------------------------------ the formatter


def test_json_line__standard_fields_in_order__utc_timestamp(lines: Lines) -> None:
    logger, stream = lines
    logger.warning("operation %s: done", "op_1")
    (record,) = records(stream)
    assert list(record)[:6] == ["timestamp", "level", "logger", "message", "process", "thread"]
    assert record["level"] == "WARNING" and record["logger"] == "toolfence.test_logs"
    assert record["message"] == "operation op_1: done"
    assert record["process"] == os.getpid() and record["thread"] == threading.current_thread().name
    # ISO 8601 in UTC, to the millisecond: 2026-12-05T04:48:00.828Z
    assert len(record["timestamp"]) == 24 and record["timestamp"].endswith("Z")
    assert record["timestamp"][10] == "T"


def test_json_line__secret_in_message_arguments_extras_and_traceback__redacted(
    lines: Lines,
) -> None:
    logger, stream = lines
    # Given a secret in each place a record can carry text
    try:
        raise RuntimeError(f"the downstream refused {SECRET}")
    except RuntimeError:
        logger.error(
            "failed with %s", SECRET, exc_info=True,
            extra={
                "note": f"value {SECRET}", "api_key": "plain-looking", "nested": {"x": [SECRET]}, "count": 3,
            },
        )
    # Then none of it is on the line; the structure is kept
    text = stream.getvalue()
    assert SECRET not in text
    (record,) = records(stream)
    assert record["message"] == "failed with [REDACTED]"
    assert record["note"] == "value [REDACTED]"
    assert record["api_key"] == "[REDACTED]"  # secret-named, whatever its value looks like
    assert record["nested"] == {"x": ["[REDACTED]"]}
    assert record["count"] == 3
    assert "RuntimeError: the downstream refused [REDACTED]" in record["exc_info"]
    assert list(record)[-1] == "exc_info"


def test_json_line__controls_dropped_long_message_capped_one_line(lines: Lines) -> None:
    logger, stream = lines
    logger.warning("a\x1b[31mred\x07\nnext line " + "x" * (2 * MESSAGE_MAX_CHARS))
    (record,) = records(stream)  # one line, whatever the message held
    assert record["message"].startswith("a[31mred\nnext line x")
    assert len(record["message"]) <= MESSAGE_MAX_CHARS


def test_json_line__library_extras_left_out__an_extra_cannot_replace_a_standard_field(
    lines: Lines,
) -> None:
    logger, stream = lines
    # Celery's `data` holds a task's arguments; uvicorn's `color_message` terminal colours
    logger.info("Task succeeded", extra={"data": {"args": ["op_1"]}, "color_message": "\x1b[1mTask"})
    logger.info("spoofed", extra={"level": "DEBUG", "logger": "other", "timestamp": "then"})
    first, second = records(stream)
    assert "data" not in first and "color_message" not in first
    assert second["level"] == "INFO" and second["logger"] == "toolfence.test_logs"
    assert second["timestamp"] != "then"


def test_json_line__dict_message_is_fields(lines: Lines) -> None:
    logger, stream = lines
    logger.info({"event": "published", "secret_token": "abcdef123456"})
    (record,) = records(stream)
    assert record["event"] == "published" and record["secret_token"] == "[REDACTED]"
    assert record["message"] == ""


# ------------------------------------------------------------------ correlation ids


def test_log_context__ids_on_records_in_the_block__gone_after(lines: Lines) -> None:
    logger, stream = lines
    with log_context(operation_id="op_1", request_id=f"req-{SECRET}"):
        bind(generation=2, tool="ledger.transfer", tenant="acme", call_id="c1")
        logger.warning("running")
        with log_context(turn_id="turn_1", step=3):
            logger.warning("nested")
        logger.warning("after nested")
    logger.warning("outside")
    running, nested, after, outside = records(stream)
    assert running["operation_id"] == "op_1" and running["generation"] == 2
    assert running["tool"] == "ledger.transfer" and running["tenant"] == "acme" and running["call_id"] == "c1"
    # an id an application chose goes through the sanitiser like any other text
    assert running["request_id"] == "req-[REDACTED]"
    # the ids come right after the standard fields, in a fixed order
    assert list(running)[6:] == ["request_id", "operation_id", "call_id", "generation", "tenant", "tool"]
    assert nested["turn_id"] == "turn_1" and nested["step"] == 3 and nested["operation_id"] == "op_1"
    assert "turn_id" not in after and after["generation"] == 2
    assert not set(logcontext.FIELDS) & set(outside)


def test_bind__undone_when_the_scope_ends() -> None:
    with log_context(operation_id="op_1"):
        bind(generation=5)
        assert logcontext.current() == {"operation_id": "op_1", "generation": 5}
    assert logcontext.current() == {}


def test_log_context__none_leaves_a_field_as_it_was__unknown_field_refused() -> None:
    with log_context(operation_id="op_1"), log_context(operation_id=None, tenant="acme"):
        assert logcontext.current() == {"operation_id": "op_1", "tenant": "acme"}
    with pytest.raises(TypeError, match="arguments"), log_context(arguments="{}"):  # type: ignore[arg-type]
        pass


def test_ids__each_thread_its_own(lines: Lines) -> None:
    logger, stream = lines
    # Given an operation running in this thread
    with log_context(operation_id="op_main"):
        # When another thread logs meanwhile (a heartbeat, another task of a threads pool)
        other = threading.Thread(target=lambda: logger.warning("other thread"))
        other.start()
        other.join()
        logger.warning("main thread")
    # Then only this thread's records carry its ids
    other_record, main_record = records(stream)
    assert "operation_id" not in other_record and main_record["operation_id"] == "op_main"


def test_filter__an_explicit_extra_wins(lines: Lines) -> None:
    logger, stream = lines
    with log_context(operation_id="op_scope"):
        logger.warning("about another", extra={"operation_id": "op_other"})
    assert records(stream)[0]["operation_id"] == "op_other"


def test_trace_ids__from_the_active_opentelemetry_span(lines: Lines) -> None:
    trace = pytest.importorskip("opentelemetry.trace")
    logger, stream = lines
    # Given an active span (as a tracer set up by the process would make one)
    context = trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C, span_id=0x00F067AA0BA902B7, is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    with trace.use_span(trace.NonRecordingSpan(context)):
        logger.warning("inside a span")
    logger.warning("no span")
    inside, outside = records(stream)
    # Then its ids are on the record, as traceparent writes them
    assert inside["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert inside["span_id"] == "00f067aa0ba902b7"
    assert "trace_id" not in outside and "span_id" not in outside


def test_trace_ids__nothing_without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given no OpenTelemetry API installed
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    # Then the filter adds no trace field, and works
    record = logging.LogRecord("t", logging.WARNING, __file__, 1, "m", None, None)
    assert CorrelationFilter().filter(record)
    assert not hasattr(record, "trace_id")


# ------------------------------------------------------------------ configuring a process


@pytest.fixture
def root_handlers() -> Iterator[None]:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = saved
        root.setLevel(level)


@pytest.mark.usefixtures("root_handlers")
def test_configure__json_replaces_our_text_handler__keeps_others() -> None:
    root = logging.getLogger()
    foreign = logging.NullHandler()
    root.handlers[:] = []
    logs.configure("text", logging.INFO)
    ours = [h for h in root.handlers]
    assert len(ours) == 1 and not logs.json_configured()
    root.addHandler(foreign)
    # When the settings name JSON
    logs.configure("json", "debug")
    # Then our text handler made way for a JSON one; the foreign one stays
    assert logs.json_configured() and foreign in root.handlers and ours[0] not in root.handlers
    assert len(root.handlers) == 2 and root.level == logging.DEBUG
    # And text again, with a handler of someone else's present, adds none (as basicConfig)
    logs.configure("text", "warning")
    assert root.handlers == [foreign] and not logs.json_configured()


def test_chosen_level__setting_else_warning__verbose_at_least_info() -> None:
    assert logs.chosen_level(None) == logging.WARNING
    assert logs.chosen_level("error") == logging.ERROR
    assert logs.chosen_level(None, verbose=True) == logging.INFO
    assert logs.chosen_level("debug", verbose=True) == logging.DEBUG
    assert logs.chosen_level("error", verbose=True) == logging.INFO


def _toolfence(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFENCE_")}
    return subprocess.run(
        [sys.executable, "-m", "executor.cli", *args],
        env={**clean, "TOOLFENCE_HOME": str(tmp_path / "home"), **env},
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )


def test_cli__json_format__every_stderr_line_a_record__a_failure_too(tmp_path: Path) -> None:
    # Given TOOLFENCE_LOG_FORMAT=json and -v (INFO: the migration logs)
    migrated = _toolfence(tmp_path, "-v", "migrate", TOOLFENCE_LOG_FORMAT="json")
    assert migrated.returncode == 0, migrated.stderr
    lines = migrated.stderr.splitlines()
    assert lines and all(json.loads(line)["level"] for line in lines), migrated.stderr
    assert any(json.loads(line)["logger"].startswith("alembic") for line in lines)
    # When a command fails (an operation that does not exist, in a bad state)
    failed = _toolfence(tmp_path, "resolve", "op_missing", "succeeded", "--tenant", "acme",
                        "--principal", "me", TOOLFENCE_LOG_FORMAT="json")
    # Then its one line is a JSON record too, with the status the text form has
    assert failed.returncode != 0
    (line,) = failed.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["message"].startswith("toolfence: ")
    # And in text, the same failure is the plain line it always was
    plain = _toolfence(
        tmp_path, "resolve", "op_missing", "succeeded", "--tenant", "acme", "--principal", "me"
    )
    assert plain.returncode == failed.returncode
    assert plain.stderr.startswith("toolfence: ") and record["message"] == plain.stderr.strip()


def test_cli__bad_log_settings_refused(tmp_path: Path) -> None:
    for name, value in (("TOOLFENCE_LOG_FORMAT", "xml"), ("TOOLFENCE_LOG_LEVEL", "loud")):
        run = _toolfence(tmp_path, "config", **{name: value})
        assert run.returncode == 2 and name in run.stderr, run.stderr


# ------------------------------------------------------------------ toolfence serve


def test_serve__each_request_named__a_sync_handler_s_thread_too(lines: Lines) -> None:
    from fastapi import FastAPI
    from starlette.testclient import TestClient

    from executor.http.observe import NameRequests

    logger, stream = lines
    app = FastAPI()

    @app.get("/sync")
    def sync_handler() -> dict[str, str]:  # run in a worker thread
        logger.warning("sync handler")
        return {}

    @app.get("/async")
    async def async_handler() -> dict[str, str]:
        logger.warning("async handler")
        return {}

    app.add_middleware(NameRequests)
    with TestClient(app) as client:
        # Given a proxy's request id, a header that is no id (text with a secret), and none
        client.get("/sync", headers={"X-Request-ID": "9f1c2d3e-proxy-id"})
        client.get("/async", headers={"X-Request-ID": f"hello {SECRET}"})
        client.get("/async")
        client.get("/sync")
    kept, replaced, fresh, fresh_sync = records(stream)
    # Then the proxy's id is kept, in the handler's thread as well
    assert kept["http_request_id"] == "9f1c2d3e-proxy-id" and kept["message"] == "sync handler"
    # and anything else gets a new id of its own, per request
    ids = {replaced["http_request_id"], fresh["http_request_id"], fresh_sync["http_request_id"]}
    assert len(ids) == 3 and all(len(i) == 32 for i in ids)
    assert SECRET not in stream.getvalue()
    assert logcontext.current() == {}
