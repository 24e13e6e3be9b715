"""`toolfence serve`: the HTTP API and the operator console."""

from __future__ import annotations

import argparse
import logging
import socket
from collections.abc import Callable
from typing import Any

from executor.cli.args import add_argument, port
from executor.telemetry import logs

HELP = "Serve the HTTP API and the operator console (runs until SIGTERM)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="the port to listen on (default: 8080)")
    add_argument(
        parser, "--workers", envvar="TOOLFENCE_HTTP_WORKERS", metavar="N",
        help="server processes sharing the port, under one supervisor that stops them all on "
        "SIGTERM and replaces one that dies; more than 1 needs TOOLFENCE_HTTP_RATE_LIMIT_STORAGE="
        "redis://… (the rate limits shared), and is refused with memory://",
    )
    add_argument(parser, "--log-level", envvar="TOOLFENCE_LOG_LEVEL", help="uvicorn's log level")


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from executor.cli.args import UserError
    from executor.cli.common import engine_of, hosted_policy_of, registry_of, settings
    from executor.http.server import HttpSettings, serve_engine
    from executor.settings import SettingsError, using
    from executor.settings.sources import CHOICE

    port(args.port)
    http = HttpSettings.from_env()
    if args.workers is not None:
        if args.workers < 1:
            raise SettingsError("--workers: at least 1")
        http = replace(http, workers=args.workers)
    problem = http.shared_limits_problem()
    if problem is not None:
        raise SettingsError(problem)  # a usage error (exit 2), as any other bad setting
    chosen = serve_engine(settings(), http)
    level = args.log_level or logging.getLevelName(
        logs.chosen_level(chosen.log_level, bool(getattr(args, "verbose", False)))
    ).lower()
    with using(chosen):
        engine = engine_of(chosen)
        registry = registry_of(chosen)
        if chosen.turn_surface and registry.surface(chosen.turn_surface) is None:
            # Every turn would be answered 503: say so once, at start, instead.
            from executor.cli.commands.keys import undeclared_surface

            raise undeclared_surface(registry, "TOOLFENCE_TURN_SURFACE")
        hosted_policy_of(chosen)  # one that will not load: one line, here, not N tracebacks
        logging.getLogger("toolfence.serve").warning(
            "toolfence serve on http://%s:%d (console: /console)%s", args.host, args.port,
            f", {http.workers} worker processes" if http.workers > 1 else "",
        )
        if http.workers == 1:
            serve_one(chosen, http, args.host, args.port, level, engine=engine, registry=registry)
            return 0
        engine.dispose()
    from executor.http.workers import Supervisor, bind

    try:
        sockets = bind(args.host, args.port, http.workers)
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    verbose = bool(getattr(args, "verbose", False))
    worker_args = (chosen, http, args.host, args.port, level, CHOICE.path, verbose)
    try:
        return Supervisor(http.workers, sockets, worker, worker_args, http.drain_seconds).run()
    finally:
        for sock in sockets:
            sock.close()


def serve_one(
    chosen: Any, http: Any, host: str, port_number: int, level: str, *,
    engine: Any = None, registry: Any = None,
    sock: socket.socket | None = None, started: Callable[[], None] | None = None,
) -> None:
    """One server process: the app over `chosen`'s engine and registry, until SIGTERM."""
    from executor.cli.common import engine_of, hosted_policy_of, registry_of
    from executor.http.server import create_app
    from executor.http.server import run as run_server

    engine = engine if engine is not None else engine_of(chosen, check_schema=False)
    registry = registry if registry is not None else registry_of(chosen)
    app = create_app(chosen, registry, http=http, hosted_policy=hosted_policy_of(chosen), engine=engine)
    run_server(
        app, host, port_number, http, log_level=level, own_logging=chosen.log_format != "json",
        sock=sock, on_started=started,
    )


def worker(
    chosen: Any, http: Any, host: str, port_number: int, level: str, config_file: str | None, verbose: bool,
    sock: socket.socket, started: Callable[[], None],
) -> None:
    """A worker process of `toolfence serve --workers N` (spawned: a fresh interpreter).
    The supervisor checked the settings and the schema; this one sets itself up as
    the command did (settings file, logs, trace role) and serves on `sock`."""
    import sys

    from executor.settings import using
    from executor.settings.sources import use_config_file
    from executor.telemetry import tracing

    use_config_file(config_file)
    logs.configure(chosen.log_format, logs.chosen_level(chosen.log_level, verbose))
    tracing.set_role("serve")
    try:
        with using(chosen):
            serve_one(chosen, http, host, port_number, level, sock=sock, started=started)
    except Exception as exc:
        # One line, as the command itself reports a failure; the supervisor sees the exit.
        logging.getLogger("toolfence.serve").error("toolfence serve worker: %s: %s", type(exc).__name__, exc)
        sys.exit(1)
