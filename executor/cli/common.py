"""What the commands share: one-line user errors, the engine, the registry, output.

A user mistake (bad URL, missing migration, unknown id, bad input file) is one
clear line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy import make_url

from executor.core.sanitize import shown_text
from executor.core.strictjson import StrictJSONError, loads_strict
from executor.core.tools import Registry
from executor.errors import CommandError
from executor.settings import VARIABLES, Settings, current, mask_url
from executor.settings.variables import INTEGER, NUMBER
from executor.store.engine import get_engine
from executor.store.migrate import SchemaNotReady, require_schema

if TYPE_CHECKING:
    from executor.providers import Surface
    from executor.providers.hosted import HostedPolicy

EXIT_USAGE = 2
EXIT_FAILURE = 1


class UserError(CommandError):
    """A mistake the user can fix; printed as one line. The exit status is 1, or
    2 (`EXIT_USAGE`) for a value given on the command line that the command cannot
    take (a negative interval, a port out of range, a file that is not a file)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def usage_error(message: str) -> UserError:
    """A command-line value the command cannot take: one line, exit 2."""
    return UserError(message, EXIT_USAGE)


MAX_INTERVAL_SECONDS = 86_400.0
"""The longest interval or wait a command takes (a day): beyond it, a typo."""


def seconds(value: float, flag: str, *, maximum: float = MAX_INTERVAL_SECONDS) -> float:
    """`value` as a number of seconds a command may wait or loop on: finite, 0 or
    more, at most `maximum`. A negative or NaN interval made `reconcile --every`
    spin (`Event.wait` returns at once), an infinite one overflows it."""
    if not math.isfinite(value) or not 0 <= value <= maximum:
        raise usage_error(f"{flag} must be a number of seconds from 0 to {maximum:g}, not {value!r}")
    return value


def port(value: int, flag: str = "--port") -> int:
    """A TCP port to listen on: 0 (any free port) to 65535."""
    if not 0 <= value <= 65_535:
        raise usage_error(f"{flag} must be a TCP port from 0 to 65535, not {value}")
    return value


def positive_count(value: int, flag: str) -> int:
    if value < 1:
        raise usage_error(f"{flag} must be 1 or more, not {value}")
    return value


def settings() -> Settings:
    """The settings `toolfence` loaded (and checked) before the command ran."""
    return current()


def add_argument(
    parser: argparse.ArgumentParser, *flags: str, envvar: str, **kwargs: Any
) -> argparse.Action:
    """A flag that overrides a setting: its type, choices and help come from the
    setting's declaration (executor/settings/variables.py), and it defaults to None,
    which leaves the setting's value (environment, settings file or default) in force."""
    variable = VARIABLES[envvar]
    if variable.kind == INTEGER:
        kwargs.setdefault("type", int)
    elif variable.kind == NUMBER:
        kwargs.setdefault("type", float)
    if variable.choices:
        kwargs.setdefault("choices", list(variable.choices))
    kwargs.setdefault("default", None)
    help_text = kwargs.pop("help", variable.help)
    return parser.add_argument(*flags, help=f"{help_text} (default: {envvar})", **kwargs)


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
