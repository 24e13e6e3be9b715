"""What the commands' implementations share: the engine, the registry, output.

Imported by a command's `run`, never at the top of a command module: it loads
SQLAlchemy and the store (`executor/cli/args.py` is what a parser needs).

A user mistake (bad URL, missing migration, unknown id, bad input file) is one
clear line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy import make_url

from executor.cli.args import UserError, usage_error
from executor.core.sanitize import shown_text
from executor.core.strictjson import StrictJSONError, loads_strict
from executor.core.times import iso_utc
from executor.core.tools import Registry
from executor.settings import Settings, current, mask_url
from executor.store.engine import get_engine
from executor.store.migrate import SchemaNotReady, require_schema

if TYPE_CHECKING:
    from executor.providers import Surface
    from executor.providers.hosted import HostedPolicy

def settings() -> Settings:
    """The settings `toolfence` loaded (and checked) before the command ran."""
    return current()


def engine_of(settings: Settings, *, check_schema: bool = True) -> Any:
    if check_schema:
        _require_sqlite_file(settings.database_url)
    engine = get_engine(settings.database_url)
    if check_schema:
        require_schema(engine, settings.database_url)
    return engine


def _require_sqlite_file(url: str) -> None:
    """A SQLite file that does not exist yet needs `migrate`, not "cannot reach the database"
    (SQLite cannot open a file in a missing directory, and would create an empty one)."""
    if not url.startswith("sqlite"):
        return
    database = make_url(url).database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return
    if not Path(database).exists():
        raise SchemaNotReady(f"no database at {database}: run `toolfence migrate`")


def registry_of(settings: Settings) -> Registry:
    """The tool registry named by TOOLFENCE_TOOLS (required); a module that will not
    load is one line."""
    from executor.core.tools import load_registry

    spec = settings.require_tools()
    try:
        return load_registry(spec)
    except Exception as exc:
        # Whatever the tools module raised (missing module or attribute, not a
        # Registry, an error at import): the user's configuration to fix.
        raise UserError(
            f"cannot load tools from TOOLFENCE_TOOLS={spec!r}: {type(exc).__name__}: {first_line(exc)}"
        ) from exc


def hosted_policy_of(settings: Settings) -> HostedPolicy:
    """The HostedPolicy named by TOOLFENCE_HOSTED_POLICY (`module:attribute`); unset,
    NO_HOSTED_TOOLS: every provider-run call is reported. One that cannot be loaded
    is the command's usage error."""
    from executor.errors import ConfigurationError
    from executor.providers.hosted import load_hosted_policy

    try:
        return load_hosted_policy(settings.hosted_policy)
    except ConfigurationError as exc:
        raise UserError(str(exc)) from exc


def surface_of(name: str) -> Surface:
    from executor.providers import SURFACES

    surface = SURFACES.get(name)
    if surface is None:
        raise UserError(f"unknown provider surface {name!r}: one of {', '.join(SURFACES)}")
    return surface


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def print_json(value: Any) -> None:
    # ASCII-escaped: a lone surrogate or a terminal escape a model wrote cannot break
    # (or drive) the operator's terminal.
    print(json.dumps(value, indent=2, sort_keys=False, default=str, ensure_ascii=True))


@overload
def shown(text: str) -> str: ...


@overload
def shown(text: None) -> None: ...


def shown(text: str | None) -> str | None:
    """Text from a producer's server context or an approver (request id, call id,
    actor, principal, tenant, key label) as an operator's output shows it: through
    the sanitiser (`shown_text`, the rule the API and the console apply too), so a
    secret an application put there is redacted (and a control character dropped)."""
    return None if text is None else shown_text(text)


def safe_url(url: str) -> str:
    """The URL without its password."""
    return mask_url(url)


def stop_on_signals(stop: threading.Event) -> None:
    def handler(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def check_broker(settings: Settings) -> None:
    from executor.broker.app import make_celery

    app = make_celery(settings)
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0.5, timeout=5)
    except Exception as exc:
        # kombu's OperationalError for a refused connection, KeyError for an unknown
        # transport, ImportError for a transport whose library is missing.
        raise UserError(
            f"cannot reach the broker at {safe_url(settings.broker_url)}: {first_line(exc)}"
        ) from None
    finally:
        app.close()


MAX_INPUT_FILE_BYTES = 16 * 1024 * 1024
"""The largest input file `toolfence enqueue` reads (a response or a call list)."""
_ENVELOPE_DEPTH = 16
"""Nesting a provider envelope adds around a call's arguments."""


def _read_regular_file(path: str) -> bytes:
    """At most `MAX_INPUT_FILE_BYTES` + 1 bytes of the regular file at `path`.

    Anything else is refused before a byte is read: a FIFO (opening one for reading
    waits for a writer, reading it waits for its data, and `enqueue <fifo>` blocked
    forever), a device (`/dev/zero`, a terminal), a directory. Opened without
    blocking, then checked on the descriptor itself, so a file swapped for a FIFO
    between a check and the open cannot block either. Standard input is `-`.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise usage_error(f"{path} is not a regular file (for standard input, give -)")
        os.set_blocking(descriptor, True)
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            return handle.read(MAX_INPUT_FILE_BYTES + 1)
    finally:
        os.close(descriptor)


def read_json_file(path: str, max_argument_depth: int) -> Any:
    """An input file, parsed strictly: at most `MAX_INPUT_FILE_BYTES`, nested at most
    the argument depth plus an envelope's, each key once (an object-form argument
    with a repeated key is refused like a text-form one), finite numbers, UTF-8."""
    try:
        if path == "-":
            stream = getattr(sys.stdin, "buffer", None)
            data = (
                stream.read(MAX_INPUT_FILE_BYTES + 1) if stream is not None
                else sys.stdin.read(MAX_INPUT_FILE_BYTES + 1).encode("utf-8", "surrogatepass")
            )
        else:
            data = _read_regular_file(path)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return loads_strict(
            data, max_bytes=MAX_INPUT_FILE_BYTES, max_depth=max_argument_depth + _ENVELOPE_DEPTH
        )
    except StrictJSONError as exc:
        if exc.code in ("json_syntax", "not_utf8"):
            raise UserError(f"{path} is {exc}") from None
        raise UserError(f"{path} is not accepted: {exc.code}: {exc}") from None


def iso(epoch_seconds: float | None) -> str | None:
    """A time the output shows: ISO 8601 UTC (executor/core/times.py); None stays None."""
    return None if epoch_seconds is None else iso_utc(float(epoch_seconds))


STATUS_TIMES = ("observed_at", "source_time")
"""The times in a call's status (a success's freshness), epoch seconds in the library."""


def status_json(status: Any) -> dict[str, Any]:
    """A call's status (a library `CallStatus`, or one already as JSON) as the CLI
    prints it: JSON, its times in ISO 8601 UTC, as the HTTP API shows them."""
    data: dict[str, Any] = status if isinstance(status, dict) else status.model_dump(mode="json")
    return {key: iso(value) if key in STATUS_TIMES else value for key, value in data.items()}
