"""`toolfence worker`: a Celery worker that executes operations."""

from __future__ import annotations

import argparse
import logging
import os
import threading
from typing import Any

from executor.telemetry import logs

HELP = "Start a Celery worker that executes operations."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("worker", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument(
        "--concurrency", type=int, default=2, metavar="N", help="operations run at once (default: 2)"
    )
    parser.add_argument(
        "--pool", default="prefork", choices=["prefork", "threads", "solo"],
        help="Celery's execution pool (default: prefork)",
    )
    parser.add_argument(
        "--loglevel", default=None,
        help="Celery's log level (default: TOOLFENCE_LOG_LEVEL, else WARNING; -v: INFO)",
    )
    parser.add_argument("--name", default=None, help="Celery node name")


def run(args: argparse.Namespace) -> int:
    from executor.cli.common import settings
    from executor.settings import using
    from executor.settings.sources import DEFAULT

    chosen = settings()
    if args.pool == "threads" and args.loaded["TOOLFENCE_DB_POOL_SIZE"].source == DEFAULT:
        # One engine for all the threads of the process: a connection per thread at most.
        chosen = chosen.with_(db_pool_size=max(5, min(args.concurrency, 64)))
    with using(chosen):
        return _work(args)


def _work(args: argparse.Namespace) -> int:
    from executor.cli.common import engine_of, hosted_policy_of, registry_of, settings

    chosen = settings()
    engine_of(chosen)
    registry_of(chosen)  # fail here, not in the first task, when the tools do not load
    hosted_policy_of(chosen)  # and the hosted-tool policy the turn jobs check
    from celery import signals as celery_signals

    from executor.worker.celery_app import worker_app

    app = worker_app(chosen)
    loglevel = args.loglevel or logging.getLevelName(
        logs.chosen_level(chosen.log_level, bool(getattr(args, "verbose", False)))
    )
    json_lines = chosen.log_format == "json"
    argv = [
        # JSON lines only: no banner printed around them.
        *(["--quiet"] if json_lines else []),
        "worker",
        f"--loglevel={loglevel}",
        f"--concurrency={args.concurrency}",
        f"--pool={args.pool}",
        "-Q",
        chosen.queue_name,
        "-n",
        args.name or f"toolfence-{os.getpid()}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    # `worker_main` drops the status the worker chose (`app.start` discards what
    # Celery's command returns), so a worker that stopped on an "Unrecoverable
    # error" (a broker reset meeting a late ack, in the chaos campaign) exited 0 and
    # a supervisor restarting on failure only (systemd's Restart=on-failure) left
    # the fleet a worker short. The status is read off the WorkController itself.
    controllers: list[Any] = []

    def remember(sender: Any, **_: Any) -> None:
        controllers.append(sender)

    def json_logging(loglevel: Any = None, **_: Any) -> None:
        # Connected, this receiver replaces Celery's own setup (which would put its
        # text handler on the root logger): JSON lines at Celery's level, and print()
        # and stray stderr output turned into records, as Celery's redirect does.
        # Prefork pool children inherit this root logger when they are forked.
        logs.configure("json", loglevel or loglevel_number)
        if app.conf.worker_redirect_stdouts:
            app.log.redirect_stdouts(app.conf.worker_redirect_stdouts_level)

    loglevel_number = logs.level_number(loglevel)
    celery_signals.worker_init.connect(remember, weak=False)
    json_receivers = (
        (celery_signals.setup_logging, json_logging),
        (celery_signals.worker_ready, _shutdown_said_in_json),
        (celery_signals.worker_shutting_down, _log_shutdown),
    )
    if json_lines:
        for signal, receiver in json_receivers:
            signal.connect(receiver, weak=False)
    try:
        app.worker_main(argv)
    finally:
        celery_signals.worker_init.disconnect(remember)
        for signal, receiver in json_receivers:
            signal.disconnect(receiver)
    code = controllers[-1].exitcode if controllers else None
    return code if isinstance(code, int) else 0


def _shutdown_said_in_json(sender: Any = None, **_: Any) -> None:
    """On SIGTERM Celery writes "worker: Warm shutdown (MainProcess)" straight to file
    descriptor 1, a line that is not JSON: its handler again, told not to say it
    (`_log_shutdown` logs it as a record instead). After Celery installed its own,
    from the main thread, where signal handlers are set."""
    from celery.apps.worker import install_worker_term_handler

    worker = getattr(sender, "controller", None)  # the consumer's WorkController
    if worker is not None and threading.current_thread() is threading.main_thread():
        try:
            install_worker_term_handler(worker, verbose=False)
        except TypeError:
            pass  # a Celery without the option: the line stays


def _log_shutdown(how: str = "Warm", **_: Any) -> None:
    logging.getLogger("toolfence.worker").warning("worker: %s shutdown (MainProcess)", how)
