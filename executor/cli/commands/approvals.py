"""`toolfence approvals`: calls waiting for approval, with their impact."""

from __future__ import annotations

import argparse

HELP = "List calls waiting for approval, with their impact."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("approvals", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("--tenant", default=None, help="only this tenant's (default: every tenant's)")


def run(args: argparse.Namespace) -> int:
    from executor import store
    from executor.cli.common import engine_of, iso, print_json, registry_of, settings, shown
    from executor.store import operator
    from executor.store.approval_impacts import card_impact

    chosen = settings()
    engine = engine_of(chosen)
    registry = registry_of(chosen)
    with engine.connect() as conn:
        rows = operator.pending_approvals(conn, tenant=args.tenant)
        hosted = store.pending_hosted_approvals(conn, tenant=args.tenant)
        now = store.read_now(conn)
    # Each impact recomputed now on current state, with the digest `toolfence approve
    # --impact-digest` takes (decision 0222); the stored one, and no digest, when it
    # cannot be (then it cannot be approved).
    cards = [(r, *card_impact(registry, r)) for r in rows]
    print_json(
        [
            {
                "approval_id": r.approval_id,
                "operation_id": r.operation_id,
                "tenant": shown(r.tenant),
                "tool": r.tool_name,
                "impact": impact,
                "impact_digest": digest,
                "impact_as_of": iso(now),
                "impact_current": digest is not None,
                "intent_hash": r.intent_hash,
                "expires_at": iso(r.expires_at),
            }
            for r, impact, digest in cards
        ]
        # Hosted MCP approvals (`hapr_…`): no operation; the impact is the redacted
        # server, tool and arguments of the provider's mcp_approval_request.
        + [
            {
                "approval_id": h.approval_id,
                "tenant": shown(h.tenant),
                "request_id": shown(h.request_id),
                "surface": h.surface,
                "tool": store.HOSTED_APPROVAL_TOOL,
                "impact": h.impact,
                "intent_hash": h.intent_hash,
                "expires_at": iso(h.expires_at),
            }
            for h in hosted
        ]
    )
    return 0
