"""`toolfence serve`: the HTTP API and the operator console."""

from __future__ import annotations

import argparse
import logging

from executor.cli.args import add_argument, port
from executor.telemetry import logs

HELP = "Serve the HTTP API and the operator console (runs until SIGTERM)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="the port to listen on (default: 8080)")
    add_argument(parser, "--log-level", envvar="TOOLFENCE_LOG_LEVEL", help="uvicorn's log level")


def run(args: argparse.Namespace) -> int:
    from executor.cli.common import engine_of, hosted_policy_of, registry_of, settings

    port(args.port)
    chosen = settings()
    engine = engine_of(chosen)
    registry = registry_of(chosen)
    if chosen.turn_surface and registry.surface(chosen.turn_surface) is None:
        # Every turn would be answered 503: say so once, at start, instead.
        from executor.cli.commands.keys import undeclared_surface

        raise undeclared_surface(registry, "TOOLFENCE_TURN_SURFACE")
    from executor.http.server import HttpSettings, create_app
    from executor.http.server import run as run_server

    http = HttpSettings.from_env()
    app = create_app(chosen, registry, http=http, hosted_policy=hosted_policy_of(chosen), engine=engine)
    logging.getLogger("toolfence.serve").warning(
        "toolfence serve on http://%s:%d (console: /console)", args.host, args.port
    )
    level = args.log_level or logging.getLevelName(
        logs.chosen_level(chosen.log_level, bool(getattr(args, "verbose", False)))
    ).lower()
    run_server(app, args.host, args.port, http, log_level=level, own_logging=chosen.log_format != "json")
    return 0
