"""`toolfence reconcile`: resolve crashed or stuck operations."""

from __future__ import annotations

import argparse
import logging
import threading

from executor.cli.args import seconds

HELP = "Resolve crashed or stuck operations: one sweep (for cron)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("reconcile", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument(
        "--every", type=float, default=0.0, metavar="SECONDS", help="loop, sweeping every N s"
    )


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from executor.cli.common import engine_of, print_json, registry_of, settings, stop_on_signals
    from executor.core.sanitize import exception_summary

    every = seconds(args.every, "--every")
    chosen = settings()
    engine = engine_of(chosen)
    from reconciler.sweep import Reconciler

    registry_of(chosen)  # one clear line if the tools do not load
    reconciler = Reconciler.from_settings(chosen, engine)
    if not every:
        report = reconciler.sweep()
        print_json(report.as_dict())
        return 0
    stop = threading.Event()
    stop_on_signals(stop)
    while not stop.is_set():
        try:
            report = reconciler.sweep()
            if report.total:
                logging.getLogger("toolfence.reconciler").info("sweep: %s", report.as_dict())
        except SQLAlchemyError as exc:
            logging.getLogger("toolfence.reconciler").error("sweep failed: %s", exception_summary(exc))
        stop.wait(every)
    return 0
