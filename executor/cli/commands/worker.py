"""`toolfence worker`: a Celery worker that executes operations."""

from __future__ import annotations

import argparse
import os
from typing import Any

from executor.cli.common import engine_of, hosted_policy_of, registry_of, settings
from executor.settings import using
from executor.settings.sources import DEFAULT

HELP = "Start a Celery worker that executes operations."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("worker", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--pool", default="prefork", choices=["prefork", "threads", "solo"])
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--name", default=None, help="Celery node name")


def run(args: argparse.Namespace) -> int:
    chosen = settings()
    if args.pool == "threads" and args.loaded["TOOLFENCE_DB_POOL_SIZE"].source == DEFAULT:
        # One engine for all the threads of the process: a connection per thread at most.
        chosen = chosen.with_(db_pool_size=max(5, min(args.concurrency, 64)))
    with using(chosen):
        return _work(args)


def _work(args: argparse.Namespace) -> int:
    chosen = settings()
    engine_of(chosen)
    registry_of(chosen)  # fail here, not in the first task, when the tools do not load
    hosted_policy_of(chosen)  # and the hosted-tool policy the turn jobs check
    from celery import signals as celery_signals

    from executor.worker.celery_app import worker_app

    app = worker_app(chosen)
    argv = [
        "worker",
        f"--loglevel={args.loglevel}",
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

    celery_signals.worker_init.connect(remember, weak=False)
    try:
        app.worker_main(argv)
    finally:
        celery_signals.worker_init.disconnect(remember)
    code = controllers[-1].exitcode if controllers else None
    return code if isinstance(code, int) else 0
