"""What `toolfence approve` and `toolfence deny` share: who decides, and the decision.

The parser half (`add_approver_arguments`) is light; the decision imports the store
when it runs (executor/cli/args.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from executor.cli.args import UserError, add_actor, roles_of

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

    from executor import store
    from executor.core.approvers import ApprovalDecision
    from executor.core.tools import Registry
    from executor.core.types import ServerContext
    from executor.settings import Settings


def add_approver_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("approval_id", help="the approval's id (apr_… or hapr_…, from `toolfence approvals`)")
    # Who decides, spelt as every command spells who acts; the earlier
    # --approver-principal, --approver-tenant and --approver-role stay as hidden aliases.
    add_actor(
        parser,
        tenant_help="the approver's tenant: must be the operation's",
        principal_help="who decides (recorded as decided_by)",
        role_help="a role of the approver (repeat, or comma-separate); the tool's approver policy names them",
        required=False,
        aliases={
            "tenant": ["--approver-tenant"], "principal": ["--approver-principal"],
            "role": ["--approver-role"],
        },
    )
    parser.add_argument(
        "--approver-context", default=None, metavar="JSON",
        help='instead of the three above: {"principal": ..., "tenant": ..., "roles": [...]}',
    )


def approver(args: argparse.Namespace) -> ServerContext:
    """The approver's identity: who decides, of which tenant, with which roles. Never
    a free string: the tool's approver policy is checked against it."""
    from executor.core.strictjson import loads_strict
    from executor.core.types import ServerContext

    if args.approver_context is not None:
        try:
            data = loads_strict(args.approver_context, max_bytes=65_536, max_depth=8)
            return ServerContext.from_json({"request_id": "cli-approval", **data})
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(
                "--approver-context must be a JSON object with principal, tenant and roles: "
                f"{type(exc).__name__}"
            ) from None
    if not args.principal or not args.tenant:
        raise UserError(
            "say who decides: --principal and --tenant (and --role for each role), "
            "or --approver-context JSON"
        )
    return ServerContext(
        principal=args.principal,
        tenant=args.tenant,
        roles=roles_of(args),
        request_id="cli-approval",
    )


def decide(args: argparse.Namespace, verb: ApprovalDecision) -> store.Decision:
    """approve or deny through the store, which checks the approver; a refusal is
    committed (it is audited) before it is reported."""
    from executor import store
    from executor.cli.common import engine_of, registry_of, settings, shown
    from executor.core.types import ErrorCode
    from executor.telemetry import metrics

    chosen = settings()
    engine = engine_of(chosen)
    registry = registry_of(chosen)
    who = approver(args)
    try:
        if args.approval_id.startswith(store.HOSTED_APPROVAL_PREFIX):
            decision = _decide_hosted(args, verb, engine, registry, who, chosen)
        else:
            decision = _decide_operation(args, verb, engine, registry, who)
    except store.ApproverUnavailable as exc:
        raise UserError(
            f"{ErrorCode.UPSTREAM_UNAVAILABLE.value}: {exc}; {args.approval_id} stays pending, "
            "run it again"
        ) from None
    metrics.count_approval_decision(decision, verb)
    if decision.outcome is store.DecisionOutcome.APPROVER_NOT_ALLOWED:
        reason = decision.refusal.value if decision.refusal else "refused"
        raise UserError(
            f"approver_not_allowed: {shown(who.principal)} may not {verb.value} "
            f"{args.approval_id} ({reason}); it stays pending"
        )
    if decision.outcome is store.DecisionOutcome.NOT_PENDING:
        raise UserError(f"approval {args.approval_id} is no longer pending (decided or expired)")
    return decision


def _decide_operation(
    args: argparse.Namespace,
    verb: ApprovalDecision,
    engine: Engine,
    registry: Registry,
    who: ServerContext,
) -> store.Decision:
    from executor import store
    from executor.core.approvers import ApprovalDecision

    with engine.begin() as conn:
        if store.get_approval(conn, args.approval_id) is None:
            raise UserError(f"no approval {args.approval_id!r}")
        if verb is ApprovalDecision.APPROVE:
            impact = _decided_impact(conn, args, registry, who)
            decision = store.approve(conn, args.approval_id, approver=who, registry=registry)
            if impact is not None and decision.outcome is store.DecisionOutcome.DECIDED:
                from executor.store.approval_impacts import record_decided_impact

                record_decided_impact(conn, args.approval_id, impact)
            return decision
        return store.deny(
            conn, args.approval_id, approver=who, registry=registry, reason=args.reason
        )


def _decided_impact(
    conn: Connection, args: argparse.Namespace, registry: Registry, who: ServerContext
) -> dict[str, Any] | None:
    """The impact this approval is decided on, recomputed now in the deciding transaction,
    as the console and the API decide (decision 0222): refused `impact_changed` when
    `--impact-digest` names another, or when it cannot be computed (a deny still can).
    None when the approval is not pending for this tenant (the store answers that)."""
    from executor.store import operator
    from executor.store.approval_impacts import card_impact

    found = operator.pending_approvals(conn, who.tenant, args.approval_id)
    if not found:
        return None
    impact, digest = card_impact(registry, found[0])
    if digest is None:
        raise UserError(
            f"impact_changed: the impact of {args.approval_id} cannot be computed now, so it "
            "cannot be approved; it stays pending"
        )
    shown_digest = getattr(args, "impact_digest", None)
    if shown_digest is not None and shown_digest != digest:
        raise UserError(
            f"impact_changed: the impact of {args.approval_id} has changed since it was shown "
            f"(now {digest}); read it again with `toolfence approvals` and decide on the new figures"
        )
    return impact


def _decide_hosted(
    args: argparse.Namespace,
    verb: ApprovalDecision,
    engine: Engine,
    registry: Registry,
    who: ServerContext,
    chosen: Settings,
) -> store.Decision:
    """A hosted MCP approval (`hapr_…`): decided against the server's ApproverPolicy in
    TOOLFENCE_HOSTED_POLICY, by the same approver check as a tool's."""
    from executor import store
    from executor.cli.common import hosted_policy_of
    from executor.core.approvers import ApprovalDecision

    approvers_for = hosted_policy_of(chosen).approvers_for
    with engine.begin() as conn:
        if store.get_hosted_approval(conn, args.approval_id) is None:
            raise UserError(f"no approval {args.approval_id!r}")
        if verb is ApprovalDecision.APPROVE:
            return store.approve_hosted(
                conn, args.approval_id, approver=who, approvers_for=approvers_for,
                registry=registry,
            )
        return store.deny_hosted(
            conn, args.approval_id, approver=who, approvers_for=approvers_for,
            registry=registry, reason=args.reason,
        )
