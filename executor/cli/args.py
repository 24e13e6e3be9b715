"""What a command's parser needs, and nothing heavier: `toolfence --help`,
`--version` and shell completion build every command's parser, so this module,
`executor/cli/main.py` and each `executor/cli/commands/<command>.py` import only
the standard library and `executor.settings` (the declarations a flag's help and
type come from) at the top. A command's implementation imports SQLAlchemy,
Celery, FastAPI, the store and the tools inside its `run` (`executor/cli/common.py`
holds what the implementations share); `tests/unit/test_cli_conventions.py`
checks that `--help` loads none of them.

The conventions every command follows (docs/fleet.md §Command-line conventions,
decision 0217):

- who acts: `--principal`, `--tenant` and `--role` (repeat it, or comma-separate);
- an identifier given as an option ends in `-id` (`--request-id`,
  `--conversation-id`, `--turn-id`);
- `--tenant` on a command that names one operation, request or turn is that
  subject's tenant, required (another tenant's is answered as unknown); on a
  list it narrows the list;
- `--json` prints JSON; times are ISO 8601 UTC (`executor/cli/common.py` `iso`).

An old spelling stays accepted as a hidden alias (`alias`): not shown in `--help`,
same destination, so a script written against it keeps working.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from executor.errors import CommandError

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


def add_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *flags: str, envvar: str, **kwargs: Any
) -> argparse.Action:
    """A flag that overrides a setting: its type, choices and help come from the
    setting's declaration (executor/settings/variables.py), and it defaults to None,
    which leaves the setting's value (environment, settings file or default) in force."""
    from executor.settings.variables import INTEGER, NUMBER, VARIABLES

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


def alias(parser: argparse.ArgumentParser, flag: str, action: argparse.Action) -> None:
    """An old spelling of `action`'s flag, still accepted, hidden from `--help`
    (and from shell completion): same destination, same type, same count."""
    kwargs: dict[str, Any] = {"dest": action.dest, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS}
    if isinstance(action, argparse._AppendAction):
        kwargs.update(action="append", metavar=action.metavar, type=action.type)
    elif isinstance(action, argparse._StoreTrueAction):
        kwargs.update(action="store_true")
    else:
        kwargs.update(metavar=action.metavar, type=action.type, choices=action.choices)
    parser.add_argument(flag, **kwargs)


def add_option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    aliases: Sequence[str] = (),
    required: bool = False,
    **kwargs: Any,
) -> argparse.Action:
    """An option with its old spellings (`aliases`) kept as hidden aliases. Required
    and aliased, it is checked after parsing (`missing_required`): argparse cannot
    see that an alias gave it."""
    checked_later = required and bool(aliases)
    if checked_later:
        kwargs["help"] = f"{kwargs['help']} (required)"
        later = list(parser.get_default("required_options") or ())
        parser.set_defaults(required_options=[*later, (flag.lstrip("-").replace("-", "_"), flag)],
                            required_prog=parser.prog)
    action = parser.add_argument(flag, required=required and not checked_later, **kwargs)
    for old in aliases:
        alias(parser, old, action)
    return action


def add_actor(
    parser: argparse.ArgumentParser,
    *,
    tenant_help: str,
    principal_help: str,
    role_help: str = "a role (repeat, or comma-separate: --role a,b)",
    required: bool = True,
    default_roles: Iterable[str] = (),
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Who acts: `--principal`, `--tenant`, `--role` (repeat, or comma-separate;
    read with `roles_of`). `aliases` maps "tenant", "principal" and "role" to the
    old spellings kept hidden (`--approver-principal`, `--actor`, ...); `--roles`
    (a comma-separated list, as enqueue and turn start spelt it) is always one."""
    old = dict(aliases or {})
    add_option(parser, "--tenant", aliases=old.get("tenant", ()), required=required, help=tenant_help)
    add_option(
        parser, "--principal", aliases=old.get("principal", ()), required=required, help=principal_help
    )
    defaults = list(default_roles)
    shown_default = f" (default: {','.join(defaults)})" if defaults else ""
    add_option(
        parser, "--role", aliases=["--roles", *old.get("role", ())], action="append", default=None,
        metavar="ROLE", help=role_help + shown_default,
    )
    parser.set_defaults(role_default=defaults)


def missing_required(args: argparse.Namespace) -> tuple[str, str] | None:
    """The command (its `prog`) and the first required option an alias could have
    given that nothing gave."""
    for dest, flag in getattr(args, "required_options", ()):
        if getattr(args, dest, None) is None:
            return str(args.required_prog), flag
    return None


def roles_of(args: argparse.Namespace) -> frozenset[str]:
    """The roles `--role` (or an alias) gave, comma-separated items split; none
    given, the command's default."""
    given = args.role if args.role is not None else args.role_default
    return frozenset(r.strip() for item in given for r in item.split(",") if r.strip())
