"""`toolfence metrics`: the Prometheus exporter."""

from __future__ import annotations

import argparse

from executor.cli.common import settings

HELP = "Serve Prometheus metrics on /metrics."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("metrics", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("--port", type=int, default=9464)
    parser.add_argument("--host", default="0.0.0.0")


def run(args: argparse.Namespace) -> int:
    chosen = settings()
    # No schema check here: the exporter must start (and report the outage through
    # toolfence_exporter_database_up) exactly when the database is unreachable.
    from executor.telemetry.exporter import serve

    serve(chosen, args.port, args.host)
    return 0
