"""How a toolfence process logs: text lines, or one JSON object a line.

`TOOLFENCE_LOG_FORMAT=json` (decision 0209) writes each record as one JSON
object on stderr (`executor.telemetry.jsonlines`: python-json-logger's
formatter, every string sanitised), with the correlation ids known where it was
logged (`executor.telemetry.logcontext`). `text` keeps the lines toolfence always
wrote (`asctime level logger: message`). `TOOLFENCE_LOG_LEVEL` sets the level
(unset: WARNING; `-v`: at least INFO).

Every command configures it once its settings are read (`executor/cli/main.py`);
a worker again when Celery sets up its logging (`executor/cli/commands/worker.py`),
and `toolfence serve` leaves uvicorn's loggers to it in JSON.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_OURS = "_toolfence_handler"
_JSON = "_toolfence_json"


def json_handler(stream: TextIO | None = None) -> logging.Handler:
    """A handler writing JSON lines, with the correlation ids, to `stream` (stderr).
    python-json-logger is imported here: a text-only process never loads it."""
    from executor.telemetry.jsonlines import SanitisingJsonFormatter
    from executor.telemetry.logcontext import CorrelationFilter

    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(SanitisingJsonFormatter())
    handler.addFilter(CorrelationFilter())
    setattr(handler, _JSON, True)
    return handler


def level_number(level: str | int) -> int:
    """`info`, `INFO` or 20 as logging's number; an unknown name is WARNING's."""
    if isinstance(level, int):
        return level
    number = logging.getLevelName(level.upper())
    return number if isinstance(number, int) else logging.WARNING


def chosen_level(log_level: str | None, verbose: bool = False) -> int:
    """TOOLFENCE_LOG_LEVEL's level (unset: WARNING); `-v` makes it at least INFO."""
    level = level_number(log_level or "warning")
    return min(level, logging.INFO) if verbose else level


def configure(log_format: str, level: str | int) -> None:
    """The root logger of this process: one handler on stderr, text or JSON, at
    `level`, in place of the one an earlier call installed.

    A text handler is installed only where the root logger has none of anyone
    else's (as `logging.basicConfig` does: a test harness capturing records keeps
    them); a JSON one always, since the format was asked for."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(old)
    if log_format != "json" and root.handlers:
        return
    handler: logging.Handler
    if log_format == "json":
        handler = json_handler()
        # A warning (Celery's about running as root, a deprecation) is a record too,
        # not a text line on stderr between the JSON ones.
        logging.captureWarnings(True)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    setattr(handler, _OURS, True)
    root.addHandler(handler)
    root.setLevel(level_number(level))


def json_configured() -> bool:
    """Whether `configure` installed JSON lines for this process."""
    return any(getattr(h, _OURS, False) and getattr(h, _JSON, False) for h in logging.getLogger().handlers)
