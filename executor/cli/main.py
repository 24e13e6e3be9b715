"""`toolfence`: one entry point, `--help` on every command.

Each command lives in its own module (`executor/cli/commands/<command>.py`); this
one builds the parser from them, loads and checks the settings before any command
runs, and turns what a command raises into one line on stderr and an exit status:
1 for a failure, 2 for a usage or configuration mistake, never a traceback.

Building the parser loads no command's implementation (`executor/cli/args.py`):
`--help`, `--version` and `completion` answer before SQLAlchemy, Celery or FastAPI
would be imported; the settings and the database errors are loaded once a command
runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from executor.cli.args import EXIT_FAILURE, EXIT_USAGE, UserError, missing_required
from executor.cli.commands import COMMANDS, command_name
from executor.telemetry import logs, tracing

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "UserError", "build_parser", "main"]


class _NoHostnameWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No hostname was supplied")


_NO_HOSTNAME_WARNING = _NoHostnameWarning()


def build_parser(command: str | None = None, *, every: bool = True) -> argparse.ArgumentParser:
    """The whole parser (`every`, for completion, the docs and the tests), or one
    where only `command` has its options and every other command is its name and
    help line: what `main` parses with, so a command's option declarations (some
    read the settings' declarations for their help) are built only when it runs or
    its `--help` is asked for."""
    parser = argparse.ArgumentParser(
        prog="toolfence",
        description="Admission, durable fenced execution and correlated results for LLM tool calls.",
        epilog="Configuration: TOOLFENCE_* variables (`toolfence config` lists them), "
        "over a TOML settings file (--config). Shell completion: `toolfence completion bash`.",
    )
    parser.add_argument("-V", "--version", action=_Version, help="print toolfence's version and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    # Not `add_argument(..., envvar=)`: that reads the settings' declarations, which
    # `toolfence --help` must not load.
    parser.add_argument(
        "--config", default=None, metavar="FILE", help="a TOML settings file (default: TOOLFENCE_CONFIG)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        name = command_name(module)
        if every or name == command:
            module.configure_parser(subparsers)
        else:
            subparsers.add_parser(name, help=module.HELP, add_help=False)
    return parser


class _Version(argparse.Action):
    """`--version`: the version is looked up when asked for (importlib.metadata reads
    the installed distributions, which `--help` need not)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"toolfence {version()}")
        parser.exit()


def version() -> str:
    """The installed distribution's version; from a checkout that is not installed,
    the version pyproject.toml declares is unknown here, and so said."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("toolfence")
    except PackageNotFoundError:
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # Which command: argparse's own reading of the global options (abbreviations and
    # `--config=FILE` included) over every command's name alone; then that command's
    # whole parser reads the line.
    command = build_parser(every=False).parse_known_args(words)[0].command
    parser = build_parser(command, every=False)
    args = parser.parse_args(words)
    missing = missing_required(args)
    if missing is not None:
        # Required, but also spelt by a hidden alias, which argparse cannot count: its
        # own message and status for a missing option.
        print(f"{missing[0]}: error: the following arguments are required: {missing[1]}", file=sys.stderr)
        return EXIT_USAGE
    if not getattr(args, "needs_settings", True):
        # `completion`: nothing it does depends on the settings, nor may it load them.
        args.build_parser = build_parser
        return int(args.func(args))
    # A command runs: its modules load now, before any log handler exists (alembic, for
    # one, logs at INFO while it is imported).
    from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

    from executor.cli.common import first_line
    from executor.settings import Settings, SettingsError, load, use_config_file, using
    from executor.settings.sources import CHOICE
    from executor.store.engine import DatabaseSettingError
    from executor.store.errors import StoreDatabaseError
    from executor.store.migrate import SchemaNotReady

    verbose = bool(getattr(args, "verbose", False))
    # Text until the settings are read; then the format and level they name.
    logs.configure("text", logs.chosen_level(None, verbose))
    # The embedded broker URL (filesystem://) has no host by design; kombu warns anyway.
    logging.getLogger("kombu.connection").addFilter(_NO_HOSTNAME_WARNING)  # once: same instance
    # The application's modules (TOOLFENCE_TOOLS, TOOLFENCE_HOSTED_POLICY) import from
    # the directory toolfence runs in, as `celery -A` and uvicorn's do.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    chosen_file = CHOICE.path
    try:
        use_config_file(getattr(args, "config", None))
        # Every setting, checked before the command runs: a bad value is one line.
        loaded = load()
        args.loaded = loaded
        chosen = Settings.from_loaded(loaded)
        logs.configure(chosen.log_format, logs.chosen_level(chosen.log_level, verbose))
        # Its default service name, should OTEL_* turn traces on (set up on first use).
        tracing.set_role(tracing.COMMAND_ROLES.get(args.command, args.command))
        with using(chosen):
            return int(args.func(args))
    except UserError as exc:
        return _fail(str(exc), exc.exit_code, verbose)
    except (SettingsError, DatabaseSettingError, SchemaNotReady) as exc:
        return _fail(str(exc), EXIT_USAGE, verbose)
    except ArgumentError as exc:
        return _fail(f"invalid database URL: {first_line(exc)}", EXIT_USAGE, verbose)
    except OperationalError as exc:
        reason = first_line(exc.orig) if exc.orig else "connection failed"
        return _fail(f"cannot reach the database: {reason}", EXIT_FAILURE, verbose)
    except StoreDatabaseError as exc:
        return _fail(f"database error: {exc}", EXIT_FAILURE, verbose)
    except DBAPIError as exc:
        # Not a connection failure: a file that is not a database, a schema someone
        # else changed. The driver's first line says which; -v shows the rest.
        reason = first_line(exc.orig) if exc.orig else first_line(exc)
        return _fail(f"database error: {reason}", EXIT_FAILURE, verbose)
    except OSError as exc:
        # A path that cannot be created or written (TOOLFENCE_HOME, a SQLite file).
        where = f": {exc.filename}" if exc.filename else ""
        return _fail(f"{exc.strerror or first_line(exc)}{where}", EXIT_FAILURE, verbose)
    except KeyboardInterrupt:
        return 130
    except (RecursionError, ValueError, UnicodeError, MemoryError) as exc:
        # Input no check above foresaw; its message may quote it, so only its type.
        return _fail(f"invalid input ({type(exc).__name__})", EXIT_FAILURE, verbose)
    except Exception as exc:
        return _fail(
            f"internal error ({type(exc).__name__}); run with -v for the traceback",
            EXIT_FAILURE, verbose,
        )
    finally:
        use_config_file(chosen_file)
        _forget_handled_interrupt()


def _forget_handled_interrupt() -> None:
    """Keep the status we return when a Ctrl-C was caught and cleaned up after.

    CPython 3.11 marks a KeyboardInterrupt that leaves code run by `exec` or
    `eval` of a string (dataclasses, namedtuple and SQLAlchemy build methods that
    way) as unhandled, even when a caller above catches it; at exit the
    interpreter then kills itself with SIGINT, after our cleanup, so `toolfence
    demo` interrupted mid-run died by signal instead of exiting 130 (one CI run
    in many). Running a string through `exec` resets that mark, and by the time
    `main` returns every interrupt has been handled.
    """
    exec("pass")  # noqa: S102 -- a constant; see the docstring


def _fail(message: str, exit_code: int, verbose: bool) -> int:
    """One line on stderr; with -v, the traceback too (for a bug report). With
    TOOLFENCE_LOG_FORMAT=json, that line is a JSON record like every other."""
    if logs.json_configured():
        logging.getLogger("toolfence").error("toolfence: %s", message, exc_info=verbose)
        return exit_code
    if verbose:
        traceback.print_exc()
    print(f"toolfence: {message}", file=sys.stderr)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
