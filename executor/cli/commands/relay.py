"""`toolfence relay`: publish outbox rows to the broker."""

from __future__ import annotations

import argparse
import logging
import os
import threading

from executor.cli.args import UserError

HELP = "Publish outbox rows to the broker (runs until SIGTERM)."
# How long `toolfence relay` tries to reach the broker before its first pass.
RELAY_CONNECT_TIMEOUT_SECONDS = 5.0


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("relay", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("--once", action="store_true", help="one pass, then exit")


def run(args: argparse.Namespace) -> int:
    from executor.cli.common import check_broker, engine_of, first_line, settings, stop_on_signals

    chosen = settings()
    engine = engine_of(chosen)
    from executor.broker.publish import celery_publishers
    from outbox.relay import Relay

    if args.once:
        # One pass for a person or cron: an unreachable broker is an error to see,
        # not rows quietly left for a later pass.
        check_broker(chosen)
    publish, publish_turn, connect, close = celery_publishers(chosen)
    if args.once:
        failures: list[Exception] = []

        def publish_noting_failures(operation_id: str) -> None:
            try:
                publish(operation_id)
            except Exception as exc:
                failures.append(exc)
                raise

        try:
            count = Relay(chosen, engine, publish_noting_failures, publish_turn).run_once()
        finally:
            close()
        if failures:
            raise UserError(
                f"published {count}, {len(failures)} failed and stay queued for the next pass: "
                f"{type(failures[0]).__name__}: {first_line(failures[0])}"
            )
        print(f"published {count}")
        return 0
    relay = Relay(chosen, engine, publish, publish_turn)
    stop = threading.Event()
    stop_on_signals(stop)
    # Connected before the first pass, so the first call after `ready` is not the one
    # that waits for the broker; at WARNING so the default log level shows it (the
    # fleet waits for this line, as for a worker's).
    connect(RELAY_CONNECT_TIMEOUT_SECONDS)
    logging.getLogger("toolfence.relay").warning("toolfence relay ready (pid %s)", os.getpid())
    try:
        relay.run_forever(stop)
    finally:
        close()
    return 0
