"""Who may approve (or deny) a call that waits for a person: a pure decision.

A tool whose approval can be needed declares an `ApproverPolicy` (no default,
like `access`). The approver is a `ServerContext` established by the
application's own authentication, never a free string. Whatever the policy,
the approver must belong to the operation's tenant, and must not be the
requester unless the policy says `allow_self_approval=True`; then the roles
and the predicate of the policy decide.

`approver_refusal` is the one function that answers; the store calls it inside
`approve` and `deny`, so the CLI, the demo and any later API all go through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from executor.core.types import ServerContext


class ApprovalDecision(StrEnum):
    APPROVE = "approve"
    DENY = "deny"


@dataclass(frozen=True)
class ApprovalSubject:
    """What an approver decides on: the operation as the store holds it.

    For a hosted MCP call (an `mcp_approval_request`), `server_label` names its
    server, `operation_id` is the hosted approval's id (`hapr_…`: no operation
    exists), and `arguments` is the same redacted summary as `impact` (the
    provider's arguments are never stored).
    """

    operation_id: str
    tool_name: str
    requester: ServerContext
    arguments: Mapping[str, Any]
    impact: Mapping[str, Any]
    decision: ApprovalDecision = ApprovalDecision.APPROVE
    server_label: str | None = None


class ApproverRefusal(StrEnum):
    """Why an approver was refused: the `details[].code` of `approver_not_allowed`."""

    OTHER_TENANT = "other_tenant"
    SELF_APPROVAL = "self_approval"
    ROLE_NOT_ALLOWED = "role_not_allowed"
    PREDICATE_REFUSED = "predicate_refused"
    # The predicate or the application's role resolver raised: fail closed.
    POLICY_FAILED = "policy_failed"
    # The tool is no longer declared, or declares no approver policy.
    NO_APPROVER_POLICY = "no_approver_policy"


@dataclass(frozen=True)
class ApproverPolicy:
    """Who may decide a tool's approvals.

    `roles`: the approver needs one of them (None: roles are not consulted, the
    predicate decides). `rule(approver, subject)`: a further condition over the
    approver's context and the operation (an amount limit per role, a team).
    `allow_self_approval`: the requester may decide her own call; off unless said.
    """

    roles: frozenset[str] | None
    rule: Callable[[ServerContext, ApprovalSubject], bool] | None = None
    allow_self_approval: bool = field(default=False, kw_only=True)

    @classmethod
    def for_roles(
        cls,
        *roles: str,
        rule: Callable[[ServerContext, ApprovalSubject], bool] | None = None,
        allow_self_approval: bool = False,
    ) -> ApproverPolicy:
        if not roles:
            raise ValueError("ApproverPolicy.for_roles needs at least one role")
        return cls(frozenset(roles), rule, allow_self_approval=allow_self_approval)

    @classmethod
    def when(
        cls,
        rule: Callable[[ServerContext, ApprovalSubject], bool],
        *,
        allow_self_approval: bool = False,
    ) -> ApproverPolicy:
        return cls(None, rule, allow_self_approval=allow_self_approval)


def approver_refusal(
    policy: ApproverPolicy | None,
    approver: ServerContext,
    subject: ApprovalSubject,
    *,
    reraise: tuple[type[BaseException], ...] = (),
) -> ApproverRefusal | None:
    """None when `approver` may take `subject.decision`, else the stable reason why not.

    The tenant is checked first and always: another tenant's approver learns
    nothing about the policy. A requester may always withdraw (deny) her own
    call; approving it needs `allow_self_approval`. A rule that raises refuses
    (`policy_failed`), unless what it raised is in `reraise` (the store: a lost
    connection, which decides nothing), which propagates.
    """
    if approver.tenant != subject.requester.tenant:
        return ApproverRefusal.OTHER_TENANT
    is_requester = approver.principal == subject.requester.principal
    if is_requester and subject.decision is ApprovalDecision.DENY:
        return None
    if policy is None:
        return ApproverRefusal.NO_APPROVER_POLICY
    if is_requester and not policy.allow_self_approval:
        return ApproverRefusal.SELF_APPROVAL
    if policy.roles is not None and not policy.roles & approver.roles:
        return ApproverRefusal.ROLE_NOT_ALLOWED
    if policy.rule is not None:
        try:
            allowed = bool(policy.rule(approver, subject))
        except reraise:
            raise
        except Exception:
            return ApproverRefusal.POLICY_FAILED
        if not allowed:
            return ApproverRefusal.PREDICATE_REFUSED
    return None
