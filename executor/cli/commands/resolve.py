"""`toolfence resolve`: resolve a reconciliation_pending operation (audited)."""

from __future__ import annotations

import argparse

from executor import store
from executor.cli.common import UserError, engine_of, settings
from executor.core.states import State

HELP = "Resolve a reconciliation_pending operation (audited)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("resolve", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("operation_id")
    parser.add_argument("outcome", choices=["succeeded", "failed", "requeue"])
    parser.add_argument("--actor", required=True, help="who decides (recorded in the audit trail)")
    parser.add_argument("--reference", default=None, help="downstream id of the effect (for succeeded)")
    parser.add_argument("--note", default=None)


def run(args: argparse.Namespace) -> int:
    from executor.store import operator

    engine = engine_of(settings())
    to_state = operator.RESOLUTIONS[args.outcome]
    if to_state is State.SUCCEEDED and not args.reference:
        raise UserError("resolving as succeeded needs --reference (the downstream's id for the effect)")
    with engine.begin() as conn:
        if store.get_operation(conn, args.operation_id) is None:
            raise UserError(f"no operation {args.operation_id!r}")
        won = operator.resolve_pending(
            conn, args.operation_id, outcome=args.outcome, actor=args.actor,
            reference=args.reference, note=args.note or "",
        )
        if not won:
            raise UserError(f"operation {args.operation_id} is not reconciliation_pending")
    print(f"resolved {args.operation_id} as {to_state.value}")
    return 0
