"""`toolfence show`: an operation's state, generations, receipts and audit trail."""

from __future__ import annotations

import argparse
import json

from executor.cli.args import UserError

HELP = "Show an operation: state, generations, receipts, audit trail."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("show", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("operation_id", help="the operation's id")
    parser.add_argument(
        "--tenant", required=True,
        help="the operation's tenant (another tenant's operation is answered as unknown)",
    )


def run(args: argparse.Namespace) -> int:
    from executor.cli.common import engine_of, iso, print_json, settings, shown
    from executor.store import operator

    engine = engine_of(settings())
    with engine.connect() as conn:
        # Another tenant's operation is answered like one that does not exist.
        record = operator.operation_record(conn, args.operation_id, tenant=args.tenant)
    if record is None:
        raise UserError(f"no operation {args.operation_id!r} for tenant {args.tenant!r}")
    row = record.row
    print_json(
        {
            "operation_id": row.operation_id,
            "tenant": shown(row.tenant),
            "request_id": shown(row.request_id),
            "call_id": shown(row.call_id),
            "tool": row.tool_name,
            "state": row.state,
            "generation": row.generation,
            "attempts": row.attempts,
            "error_code": row.error_code,
            "cause": operator.operation_cause(row),
            # Operator view: for `approval_scope_exceeded`, the approved and changed sets.
            "error": json.loads(row.error) if row.error else None,
            "receipt": shown(row.receipt),
            "receipts": [
                {"receipt": shown(r.receipt), "generation": r.generation, "accepted": r.accepted}
                for r in record.receipts
            ],
            "audit": [
                {
                    "at": iso(e.at),
                    "from": e.from_state,
                    "to": e.to_state,
                    "decision": e.decision_code,
                    "generation": e.generation,
                    "actor": shown(e.actor),
                }
                for e in record.audit
            ],
        }
    )
    return 0
