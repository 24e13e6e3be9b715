"""`toolfence deny`: deny a pending call."""

from __future__ import annotations

import argparse

from executor.cli.commands.decision import add_approver_arguments

HELP = "Deny a pending call."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("deny", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    add_approver_arguments(parser)
    parser.add_argument(
        "--reason", default="denied", help="why, recorded with the decision (default: denied)"
    )


def run(args: argparse.Namespace) -> int:
    from executor.cli.commands.decision import decide
    from executor.core.approvers import ApprovalDecision

    decide(args, ApprovalDecision.DENY)
    print(f"denied {args.approval_id}")
    return 0
