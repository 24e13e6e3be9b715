"""`toolfence`: one entry point, `--help` on every command.

Each command lives in its own module (`executor/cli/commands/<command>.py`); this
one builds the parser from them, loads and checks the settings before any command
runs, and turns what a command raises into one line on stderr and an exit status:
1 for a failure, 2 for a usage or configuration mistake, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from executor.cli.commands import COMMANDS
from executor.cli.common import EXIT_FAILURE, EXIT_USAGE, UserError, add_argument, first_line
from executor.settings import Settings, SettingsError, load, use_config_file, using
from executor.settings.sources import CHOICE
from executor.store.engine import DatabaseSettingError
from executor.store.errors import StoreDatabaseError
from executor.store.migrate import SchemaNotReady
from executor.telemetry import logs, tracing

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "UserError", "build_parser", "main"]


class _NoHostnameWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No hostname was supplied")


_NO_HOSTNAME_WARNING = _NoHostnameWarning()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolfence",
        description="Admission, durable fenced execution and correlated results for LLM tool calls.",
        epilog="Configuration: TOOLFENCE_* variables (`toolfence config` lists them), "
        "over a TOML settings file (--config).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    add_argument(parser, "--config", envvar="TOOLFENCE_CONFIG", metavar="FILE", help="a TOML settings file")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.configure_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
