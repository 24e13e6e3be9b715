"""`toolfence pending`: operations waiting for a person (reconciliation_pending)."""

from __future__ import annotations

import argparse

from executor.cli.args import positive_count

HELP = "List operations waiting for a person (reconciliation_pending)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("pending", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument(
        "--limit", type=int, default=100, metavar="N", help="at most N operations (default: 100)"
    )
    parser.add_argument("--tenant", default=None, help="only this tenant's (default: every tenant's)")


def run(args: argparse.Namespace) -> int:
    from executor.cli.common import engine_of, iso, print_json, settings, shown
    from executor.store import operator

    limit = positive_count(args.limit, "--limit")
    engine = engine_of(settings())
    with engine.connect() as conn:
        rows = operator.reconciliation_pending(conn, tenant=args.tenant, limit=limit)
    print_json(
        [
            {
                "operation_id": r.operation_id,
                "tenant": shown(r.tenant),
                "tool": r.tool_name,
                "request_id": shown(r.request_id),
                "call_id": shown(r.call_id),
                "generation": r.generation,
                "since": iso(r.updated_at),
                "reason": operator.operation_reason(r),
                "cause": operator.operation_cause(r),
            }
            for r in rows
        ]
    )
    return 0
