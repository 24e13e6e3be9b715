"""`toolfence approve`: approve a pending call."""

from __future__ import annotations

import argparse

from executor.cli.commands.decision import add_approver_arguments

HELP = "Approve a pending call (single use, bound to its intent)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("approve", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    add_approver_arguments(parser)
    parser.add_argument(
        "--impact-digest", default=None, metavar="DIGEST",
        help="the impact_digest `toolfence approvals` showed: refused impact_changed (nothing "
        "decided) when the impact recomputed now differs; without it, approved on the impact as it is now",
    )


def run(args: argparse.Namespace) -> int:
    from executor.cli.commands.decision import decide
    from executor.core.approvers import ApprovalDecision

    decide(args, ApprovalDecision.APPROVE)
    print(f"approved {args.approval_id}")
    return 0
