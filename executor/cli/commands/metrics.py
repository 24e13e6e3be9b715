"""`toolfence metrics`: the Prometheus exporter.

Workers, relays and reconcilers count in their own processes; the exporter reads
their counters from PROMETHEUS_MULTIPROC_DIR, the directory every process of the
fleet writes to. Unset, it would serve the database's gauges alone while looking
complete, so it refuses to start (one line, exit 2) unless `--database-only` says
that is what is wanted.
"""

from __future__ import annotations

import argparse

from executor.cli.args import add_argument, port, usage_error

HELP = "Serve Prometheus metrics on /metrics."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("metrics", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    add_argument(parser, "--port", envvar="TOOLFENCE_METRICS_PORT")
    # Loopback by default: the metrics name tenants, tools and error codes, and the
    # exporter has no authentication. Expose it on purpose (`--host 0.0.0.0` in a
    # container that Prometheus scrapes over a private network).
    add_argument(parser, "--host", envvar="TOOLFENCE_METRICS_HOST")
    parser.add_argument(
        "--database-only", action="store_true",
        help="serve the database's gauges alone, without PROMETHEUS_MULTIPROC_DIR (the fleet's counters)",
    )


def run(args: argparse.Namespace) -> int:
    loaded = args.loaded
    chosen_port = port(
        args.port if args.port is not None else loaded["TOOLFENCE_METRICS_PORT"].value,
        "--port" if args.port is not None else "TOOLFENCE_METRICS_PORT",
    )
    host = args.host if args.host is not None else loaded["TOOLFENCE_METRICS_HOST"].value
    if not host:
        raise usage_error("--host must name an address to listen on (127.0.0.1, 0.0.0.0, ::1, …)")
    from executor.cli.common import settings

    chosen = settings()
    if not chosen.metrics_dir and not args.database_only:
        raise usage_error(
            "PROMETHEUS_MULTIPROC_DIR is not set: the workers' and relays' counters would be missing; "
            "set it to the directory every process of the fleet writes to (or --database-only)"
        )
    # No schema check here: the exporter must start (and report the outage through
    # toolfence_exporter_database_up) exactly when the database is unreachable.
    from executor.telemetry.exporter import serve

    serve(chosen, chosen_port, host)
    return 0
