"""`toolfence serve`: the HTTP API and the operator console."""

from __future__ import annotations

import argparse
import logging

from executor.cli.common import engine_of, hosted_policy_of, port, registry_of, settings

HELP = "Serve the HTTP API and the operator console (runs until SIGTERM)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"]
    )


def run(args: argparse.Namespace) -> int:
    port(args.port)
    chosen = settings()
    engine = engine_of(chosen)
    registry = registry_of(chosen)
    from executor.http.server import HttpSettings, create_app
    from executor.http.server import run as run_server

    http = HttpSettings.from_env()
    app = create_app(chosen, registry, http=http, hosted_policy=hosted_policy_of(chosen), engine=engine)
    logging.getLogger("toolfence.serve").warning(
        "toolfence serve on http://%s:%d (console: /console)", args.host, args.port
    )
    run_server(app, args.host, args.port, http, log_level=args.log_level)
    return 0
