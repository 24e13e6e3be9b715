"""One JSON object a line: the records of `TOOLFENCE_LOG_FORMAT=json`.

python-json-logger's formatter writes `timestamp` (UTC, ISO 8601), `level`,
`logger`, `message`, `process`, `thread`, then the correlation ids known where
the record was logged (`executor.telemetry.logcontext`: request, operation,
call, generation, tenant, tool, turn, step, HTTP request, and an active
OpenTelemetry span's trace and span ids), then any other field a caller or a
library added, then `exc_info`.

Log messages in toolfence hold ids, codes and counts, never an argument value;
this formatter is the second guard. The message, a traceback's text, every id
and every other string field pass through the one sanitiser
(`executor.core.sanitize`): anything shaped like a credential is redacted,
control characters dropped, lengths capped. A structured field is redacted as
`redact_json` redacts a tool's output (secret-named members too).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from executor.core.sanitize import redact_json, sanitize_text, shown_text
from executor.telemetry.logcontext import FIELDS, TRACE_FIELDS

MESSAGE_MAX_CHARS = 4_096
"""The most of one record's message a JSON line keeps (after redaction)."""
TRACEBACK_MAX_CHARS = 16_384
"""The most of a record's traceback (`exc_info`, `stack_info`) a JSON line keeps."""
EXTRA_MAX_CHARS = 4_096
"""The most JSON text of the other fields of one record a line keeps."""

# Fields a record carries that a JSON line leaves out: the standard record's own
# (written under their names below, or not at all), and what libraries add for
# their own formatters: uvicorn's `color_message` (the message with terminal
# colours), Celery's `data` (the task's arguments and return value: the message
# already says what a person needs, and a task's arguments are not for logs).
_LEFT_OUT = frozenset({*RESERVED_ATTRS, "taskName", "color_message", "data"})
_HEAD = ("timestamp", "level", "logger", "message", "process", "thread")
_CORRELATION = (*FIELDS, *TRACE_FIELDS)
_TEXT_BLOCKS = ("exc_info", "stack_info")


class SanitisingJsonFormatter(JsonFormatter):
    """python-json-logger's formatter, its fields named and ordered as above and
    every string that could quote an application's data sanitised."""

    def __init__(self) -> None:
        super().__init__(
            ["levelname", "name", "message", "process", "threadName"],
            rename_fields={"levelname": "level", "name": "logger", "threadName": "thread"},
            reserved_attrs=sorted(_LEFT_OUT),
            json_ensure_ascii=True,
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        # From the record itself, last: an extra named `level` or `timestamp` (merged
        # in above) cannot stand in for the record's own.
        log_data.update(
            timestamp=datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            level=record.levelname, logger=record.name, message=record.message,
            process=record.process, thread=record.threadName,
        )

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {key: log_data.pop(key) for key in _HEAD if key in log_data}
        out["message"] = sanitize_text(str(out.get("message", "")), MESSAGE_MAX_CHARS)[0]
        for key in _CORRELATION:
            if key in log_data:
                out[key] = _identifier(log_data.pop(key))
        blocks = {key: log_data.pop(key) for key in _TEXT_BLOCKS if key in log_data}
        if log_data:
            for key, value in _extras(log_data).items():
                out.setdefault(key, value)
        for key, text in blocks.items():
            out[key] = sanitize_text(text if isinstance(text, str) else str(text), TRACEBACK_MAX_CHARS)[0]
        return out


def _identifier(value: Any) -> str | int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return shown_text(str(value))


def _extras(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Other fields as JSON values, redacted as a tool's output is (`redact_json`):
    secret-shaped strings and secret-named members, controls dropped, capped."""
    plain = json.loads(json.dumps(dict(fields), default=str, ensure_ascii=True, skipkeys=True))
    redacted = redact_json(plain, max_depth=8, limit=EXTRA_MAX_CHARS)
    return dict(redacted) if isinstance(redacted, dict) else {}
