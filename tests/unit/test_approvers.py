"""Who may approve: the approver policy a tool must declare, and its pure decision."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from executor.core.admission import recheck_before_run
from executor.core.approvers import (
    ApprovalDecision,
    ApprovalSubject,
    ApproverPolicy,
    ApproverRefusal,
    approver_refusal,
)
from executor.core.tools import (
    Access,
    Approval,
    Effect,
    Mode,
    Registry,
    RoleResolutionFailed,
    Tool,
    ToolDeclarationError,
)
from executor.core.types import ErrorCode, ServerContext


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int = 0


def declare(approval: Approval, **fields: object) -> Tool[Args]:
    return Tool(
        name="pay", description="", mode=Mode.WRITE, input_model=Args, output_model=Args,
        run=lambda args, ctx: None, access=Access.for_roles("member"), approval=approval,
        effect=[Effect.IDEMPOTENT], untrusted_output=False, **fields,  # type: ignore[arg-type]
    )


def who(principal: str, tenant: str = "acme", *roles: str) -> ServerContext:
    return ServerContext(principal=principal, tenant=tenant, roles=frozenset(roles), request_id="r")


REQUESTER = who("alice", "acme", "member")


def subject(decision: ApprovalDecision = ApprovalDecision.APPROVE, amount: int = 100) -> ApprovalSubject:
    return ApprovalSubject(
        operation_id="op-1", tool_name="pay", requester=REQUESTER, arguments={"amount": amount},
        impact={}, decision=decision,
    )


# ------------------------------------------------------------------ declaration


@pytest.mark.parametrize(
    "approval", [Approval.always(), Approval.when(lambda args, ctx: True)], ids=["always", "when"]
)
def test_tool__can_need_approval_without_approvers__declaration_error(approval: Approval) -> None:
    with pytest.raises(ToolDeclarationError, match="approvers"):
        declare(approval)
    with pytest.raises(ToolDeclarationError, match="approvers"):
        declare(approval, approvers=None)


def test_tool__never_needs_approval__approvers_may_be_left_out() -> None:
    assert declare(Approval.never()).approvers is None


def test_tool__approvers_of_the_wrong_type_or_naming_nobody__declaration_error() -> None:
    with pytest.raises(ToolDeclarationError, match="ApproverPolicy"):
        declare(Approval.always(), approvers=frozenset({"approver"}))
    with pytest.raises(ToolDeclarationError, match="no role and no rule"):
        declare(Approval.always(), approvers=ApproverPolicy(roles=None))


def test_approver_policy__for_roles_without_a_role__refused() -> None:
    with pytest.raises(ValueError, match="at least one role"):
        ApproverPolicy.for_roles()


# ------------------------------------------------------------------ the decision


@pytest.mark.parametrize(
    ("policy", "approver", "decision", "expected"),
    [
        pytest.param(ApproverPolicy.for_roles("approver"), who("bob", "acme", "approver"),
                     ApprovalDecision.APPROVE, None, id="allowed"),
        pytest.param(ApproverPolicy.for_roles("approver"), who("bob", "globex", "approver"),
                     ApprovalDecision.APPROVE, ApproverRefusal.OTHER_TENANT, id="other-tenant"),
        pytest.param(ApproverPolicy.for_roles("approver"), who("alice", "acme", "approver"),
                     ApprovalDecision.APPROVE, ApproverRefusal.SELF_APPROVAL, id="requester"),
        pytest.param(ApproverPolicy.for_roles("approver", allow_self_approval=True),
                     who("alice", "acme", "approver"), ApprovalDecision.APPROVE, None,
                     id="requester-allowed-explicitly"),
        pytest.param(ApproverPolicy.for_roles("approver", allow_self_approval=True),
                     who("alice", "acme", "member"), ApprovalDecision.APPROVE,
                     ApproverRefusal.ROLE_NOT_ALLOWED, id="self-allowed-still-needs-the-role"),
        pytest.param(ApproverPolicy.for_roles("approver", allow_self_approval=True),
                     who("alice", "globex", "approver"), ApprovalDecision.APPROVE,
                     ApproverRefusal.OTHER_TENANT, id="same-name-other-tenant"),
        pytest.param(ApproverPolicy.for_roles("approver"), who("carol", "acme", "member"),
                     ApprovalDecision.APPROVE, ApproverRefusal.ROLE_NOT_ALLOWED, id="wrong-role"),
        pytest.param(ApproverPolicy.when(lambda a, s: s.arguments["amount"] < 50),
                     who("bob", "acme"), ApprovalDecision.APPROVE, ApproverRefusal.PREDICATE_REFUSED,
                     id="rule-says-no"),
        pytest.param(ApproverPolicy.when(lambda a, s: 1 / 0 > 0), who("bob", "acme"),
                     ApprovalDecision.APPROVE, ApproverRefusal.POLICY_FAILED, id="rule-raises"),
        pytest.param(None, who("bob", "acme", "approver"), ApprovalDecision.APPROVE,
                     ApproverRefusal.NO_APPROVER_POLICY, id="no-policy"),
        pytest.param(ApproverPolicy.for_roles("approver"), who("alice", "acme", "member"),
                     ApprovalDecision.DENY, None, id="requester-withdraws"),
        pytest.param(None, who("alice", "acme"), ApprovalDecision.DENY, None,
                     id="requester-withdraws-without-policy"),
        pytest.param(ApproverPolicy.for_roles("approver"), who("carol", "acme", "member"),
                     ApprovalDecision.DENY, ApproverRefusal.ROLE_NOT_ALLOWED, id="wrong-role-denies"),
        pytest.param(ApproverPolicy.for_roles("approver"), who("alice", "globex", "member"),
                     ApprovalDecision.DENY, ApproverRefusal.OTHER_TENANT, id="other-tenant-denies"),
    ],
)
def test_approver_refusal__table(
    policy: ApproverPolicy | None,
    approver: ServerContext,
    decision: ApprovalDecision,
    expected: ApproverRefusal | None,
) -> None:
    assert approver_refusal(policy, approver, subject(decision)) is expected


def test_approver_refusal__other_tenant__rule_never_consulted() -> None:
    consulted: list[str] = []

    def rule(approver: ServerContext, subject: ApprovalSubject) -> bool:
        consulted.append(approver.principal)
        return True

    refusal = approver_refusal(ApproverPolicy.when(rule), who("eve", "globex"), subject())

    assert refusal is ApproverRefusal.OTHER_TENANT
    assert consulted == []


# ------------------------------------------------------------------ role resolver


def test_registry__no_role_resolver__stored_context_stands() -> None:
    assert Registry().current_context(REQUESTER) is REQUESTER


def test_registry__role_resolver__current_roles_replace_the_stored_ones() -> None:
    registry = Registry(role_resolver=lambda ctx: {"member", "auditor"} if ctx.tenant == "acme" else ())

    current = registry.current_context(REQUESTER)

    assert current.roles == frozenset({"member", "auditor"})
    assert (current.principal, current.tenant, current.request_id) == ("alice", "acme", "r")


@pytest.mark.parametrize(
    "resolver",
    [lambda ctx: 1 / 0, lambda ctx: "member", lambda ctx: [1, 2]],
    ids=["raises", "one-string", "not-role-names"],
)
def test_registry__role_resolver_fails_or_answers_nonsense__role_resolution_failed(
    resolver: object,
) -> None:
    registry = Registry(role_resolver=resolver)  # type: ignore[arg-type]

    with pytest.raises(RoleResolutionFailed):
        registry.current_context(REQUESTER)


def test_registry__role_resolver_lost_its_connection__reraise_propagates_it_else_resolution_failed() -> None:
    def directory_down(ctx: ServerContext) -> list[str]:
        raise ConnectionError("directory reset")

    registry = Registry(role_resolver=directory_down)

    # What the caller names in `reraise` is not an answer: it propagates as it is
    with pytest.raises(ConnectionError):
        registry.current_context(REQUESTER, reraise=(ConnectionError,))
    # Without it, any exception of the resolver is a failure to resolve (fail closed)
    with pytest.raises(RoleResolutionFailed):
        registry.current_context(REQUESTER)


# ------------------------------------------------------------------ re-check before run


def test_recheck_before_run__approval_now_needed_and_none_given__approval_required() -> None:
    tool = declare(Approval.always(), approvers=ApproverPolicy.for_roles("approver"))

    unapproved = recheck_before_run(tool, Args(), REQUESTER, approved=False)
    approved = recheck_before_run(tool, Args(), REQUESTER, approved=True)

    assert unapproved is not None and unapproved.code is ErrorCode.APPROVAL_REQUIRED
    assert approved is None


def test_recheck_before_run__approval_predicate_raises__asks_for_approval() -> None:
    def broken(args: Args, ctx: ServerContext) -> bool:
        raise RuntimeError("cannot decide")

    tool = declare(Approval.when(broken), approvers=ApproverPolicy.for_roles("approver"))

    refusal = recheck_before_run(tool, Args(), REQUESTER, approved=False)

    assert refusal is not None and refusal.code is ErrorCode.APPROVAL_REQUIRED


def test_recheck_before_run__reraise__named_exception_passes_through_others_refuse() -> None:
    def check(args: Args, ctx: ServerContext) -> None:
        raise ConnectionError("ledger down")

    tool = declare(Approval.never(), check=check)

    with pytest.raises(ConnectionError):
        recheck_before_run(tool, Args(), REQUESTER, approved=False, reraise=(ConnectionError,))
    refusal = recheck_before_run(tool, Args(), REQUESTER, approved=False)
    assert refusal is not None
    assert (refusal.code, refusal.message) == (
        ErrorCode.BUSINESS_RULE_VIOLATION, "the business rule check failed",
    )
