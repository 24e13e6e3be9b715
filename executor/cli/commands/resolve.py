"""`toolfence resolve`: resolve a reconciliation_pending operation (audited)."""

from __future__ import annotations

import argparse

from executor.cli.args import UserError, add_option

HELP = "Resolve a reconciliation_pending operation (audited)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("resolve", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("operation_id", help="the operation's id (from `toolfence pending`)")
    parser.add_argument(
        "outcome", choices=["succeeded", "failed", "requeue"],
        help="what happened downstream: succeeded (with --reference), failed, or requeue (run it again)",
    )
    parser.add_argument(
        "--tenant", required=True,
        help="the operation's tenant (another tenant's operation is answered as unknown)",
    )
    add_option(
        parser, "--principal", aliases=["--actor"], required=True,
        help="who decides (recorded in the audit trail)",
    )
    parser.add_argument("--reference", default=None, help="downstream id of the effect (for succeeded)")
    parser.add_argument("--note", default=None, help="why, recorded in the audit trail")


def run(args: argparse.Namespace) -> int:
    from executor import store
    from executor.cli.common import engine_of, settings
    from executor.core.states import State
    from executor.store import operator

    engine = engine_of(settings())
    to_state = operator.RESOLUTIONS[args.outcome]
    if to_state is State.SUCCEEDED and not args.reference:
        raise UserError("resolving as succeeded needs --reference (the downstream's id for the effect)")
    with engine.begin() as conn:
        found = store.get_operation(conn, args.operation_id)
        if found is None or found.tenant != args.tenant:
            # Another tenant's operation is answered like one that does not exist (as `show`).
            raise UserError(f"no operation {args.operation_id!r} for tenant {args.tenant!r}")
        won = operator.resolve_pending(
            conn, args.operation_id, outcome=args.outcome, actor=args.principal,
            reference=args.reference, note=args.note or "",
        )
        if not won:
            raise UserError(f"operation {args.operation_id} is not reconciliation_pending")
    print(f"resolved {args.operation_id} as {to_state.value}")
    return 0
