"""`toolfence config`: every setting, its value and where the value came from.

Secrets are masked: the HTTP session secret whole, the password inside a URL
(database, broker, rate-limit storage).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executor.settings import Loaded

HELP = "List every setting: its value (secrets masked) and its source (default, env or file)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("config", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("--json", action="store_true", help="as JSON: name, value, source, secret, help")


def run(args: argparse.Namespace) -> int:
    from executor.cli.common import print_json

    loaded: Loaded = args.loaded
    if args.json:
        print_json(
            [
                {
                    "name": name, "value": value.shown, "source": value.source,
                    "secret": value.variable.secret, "help": value.variable.help,
                }
                for name, value in loaded.items()
            ]
        )
        return 0
    width = max(len(name) for name in loaded)
    print(f"# settings file: {_printable(loaded.config_file or '(none)')}")
    for name, value in loaded.items():
        print(f"{name:<{width}}  {value.source:<8}  {_printable(value.shown)}")
    return 0


def _printable(text: str) -> str:
    """A value as one line on the terminal: a control character is escaped, never sent."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
