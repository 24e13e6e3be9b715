"""`toolfence demo`: a real fleet on the embedded default, keeping its promises.

The demo runs the reference downstream (`ledger/`, beside `executor/` in a
checkout): it sets TOOLFENCE_TOOLS to the ledger's registry itself.
"""

from __future__ import annotations

import argparse

HELP = "Run a real fleet on the embedded default and show it keep its promises."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("demo", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("--calls", type=int, default=300, help="proposed calls in the workload")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--lease", type=float, default=3.0, metavar="SECONDS", help="lease seconds")
    parser.add_argument(
        "--serve", action="store_true", help="also run the operator console, kept up after the report"
    )
    parser.add_argument("--serve-port", type=int, default=8080, help="the console's port (with --serve)")


def run(args: argparse.Namespace) -> int:
    from executor.cli.demo.run import run_demo

    return int(
        run_demo(
            calls=args.calls, workers=args.workers, lease_seconds=args.lease,
            serve_port=args.serve_port if args.serve else None,
        )
    )
