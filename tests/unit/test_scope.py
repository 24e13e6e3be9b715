"""Approved set = changed set, pure: the declaration, admission, the comparison.

A write may declare `resources(args, ctx)`: the resource ids it may change,
computed by the server. Admission validates the set, shows it in the approver's
impact and binds it into the intent hash; the worker compares it with what the
handler reports in `Written.changed_resources` (executor/core/scope.py). The
runner and the store are covered in tests/integration/test_approval_scope.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from executor.core.admission import Admitted, Rejected, admit, compute_intent_hash
from executor.core.approvers import ApproverPolicy
from executor.core.scope import (
    MAX_DECLARED_RESOURCES,
    RECORDED_IDS_CAP,
    InvalidResourceSet,
    bounded_ids,
    check_scope,
    declared_resources,
)
from executor.core.tools import (
    Access,
    Approval,
    BusinessRuleViolation,
    Effect,
    Mode,
    Registry,
    RunContext,
    Tool,
    ToolDeclarationError,
    Written,
)
from executor.core.types import ErrorCode, ProposedCall, ServerContext

ALWAYS = Approval.always()
CTX = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="r")


class BatchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[str] = Field(min_length=1, max_length=2000)


class Output(BaseModel):
    sent: int


def _run(args: BatchArgs, ctx: RunContext) -> Written:
    return Written(Output(sent=len(args.ids)), "rcpt", changed_resources=args.ids)


def batch_tool(
    resources: Any = lambda args, ctx: [f"acct:{i}" for i in args.ids],
    *,
    approval: Approval = ALWAYS,
    impact: Any = None,
) -> Tool[BatchArgs]:
    return Tool(
        name="batch", description="a batch write", mode=Mode.WRITE, input_model=BatchArgs,
        untrusted_output=False,
        output_model=Output, run=_run, access=Access.for_roles("member"), approval=approval,
        approvers=ApproverPolicy.for_roles("approver"),
        effect=[Effect.IDEMPOTENT], resources=resources, impact=impact,
    )


def admit_batch(tool: Tool[Any], ids: list[str]) -> Admitted | Rejected:
    call = ProposedCall(call_id="c", tool_name=tool.name, arguments=json.dumps({"ids": ids}))
    return admit(call, Registry([tool]), CTX)


# ---------------------------------------------------------------- the comparison


def test_check_scope__changed_within_approved__no_excess_fewer_is_fine() -> None:
    approved = frozenset({"a", "b", "c"})

    assert check_scope(approved, {"a", "b", "c"}) is None
    assert check_scope(approved, {"a"}) is None
    assert check_scope(approved, set()) is None


def test_check_scope__one_outside__excess_names_it() -> None:
    exceeded = check_scope(frozenset({"a", "b"}), ["a", "b", "z"])

    assert exceeded is not None
    assert exceeded.outside == frozenset({"z"})


def test_error_json__more_ids_than_the_cap__keeps_the_cap_and_says_how_many_were_cut() -> None:
    approved = frozenset(f"acct:{n:04d}" for n in range(50))
    changed = approved | {f"acct:x{n:04d}" for n in range(RECORDED_IDS_CAP + 30)}

    exceeded = check_scope(approved, changed)
    assert exceeded is not None
    error = exceeded.error_json("rcpt-1")

    assert error["cause"] == "approval_scope_exceeded"
    assert error["receipt"] == "rcpt-1"
    assert error["approved_resources"] == {"ids": sorted(approved), "count": 50, "omitted": 0}
    outside = error["outside_approved"]
    assert (outside["count"], outside["omitted"], len(outside["ids"])) == (
        RECORDED_IDS_CAP + 30, 30, RECORDED_IDS_CAP,
    )
    assert outside["ids"] == sorted(changed - approved)[:RECORDED_IDS_CAP]
    assert error["changed_resources"]["count"] == 50 + RECORDED_IDS_CAP + 30
    assert len(error["changed_resources"]["ids"]) == RECORDED_IDS_CAP


def test_bounded_ids__duplicates__counted_once() -> None:
    assert bounded_ids(["b", "a", "b"], cap=5) == {"ids": ["a", "b"], "count": 2, "omitted": 0}


@pytest.mark.parametrize(
    "ids",
    [
        pytest.param("acct:1", id="one-string"),
        pytest.param([""], id="empty-id"),
        pytest.param(["x" * 201], id="id-too-long"),
        pytest.param([1], id="not-a-string"),
        pytest.param([f"acct:{n}" for n in range(MAX_DECLARED_RESOURCES + 1)], id="too-many"),
    ],
)
def test_declared_resources__not_a_bounded_set_of_ids__refused(ids: Any) -> None:
    with pytest.raises(InvalidResourceSet):
        declared_resources(ids)


# ---------------------------------------------------------------- the declaration


def test_read_declaring_resources__declaration_error() -> None:
    with pytest.raises(ToolDeclarationError, match="only a write"):
        Tool(
            name="r", description="", mode=Mode.READ, input_model=BatchArgs, output_model=Output,
            untrusted_output=False,
            run=_run, access=Access.public_tool(), approval=Approval.never(),
            resources=lambda args, ctx: [],
        )


def test_written__changed_resources_from_a_list__kept_as_a_frozenset() -> None:
    written = Written(None, "rcpt", changed_resources=["b", "a", "b"])  # type: ignore[arg-type]

    assert written.changed_resources == frozenset({"a", "b"})
    assert Written(None, "rcpt").changed_resources is None


# ---------------------------------------------------------------- admission


def test_admit__write_declaring_resources__set_recorded_and_shown_to_the_approver() -> None:
    admitted = admit_batch(batch_tool(), ["2", "1"])

    assert isinstance(admitted, Admitted)
    assert admitted.approved_resources == frozenset({"acct:1", "acct:2"})
    assert admitted.needs_approval
    assert admitted.impact is not None
    assert admitted.impact["resources"] == ["acct:1", "acct:2"]
    assert admitted.impact["resource_count"] == 2


def test_admit__tool_impact_names_other_resources__approver_sees_the_servers_set() -> None:
    tool = batch_tool(impact=lambda args, ctx: {"summary": "notify", "resources": ["acct:other"]})

    admitted = admit_batch(tool, ["1"])

    assert isinstance(admitted, Admitted) and admitted.impact is not None
    assert admitted.impact == {"summary": "notify", "resources": ["acct:1"], "resource_count": 1}


def test_admit__no_approval_needed__set_still_recorded_no_impact() -> None:
    admitted = admit_batch(batch_tool(approval=Approval.never()), ["1"])

    assert isinstance(admitted, Admitted)
    assert admitted.approved_resources == frozenset({"acct:1"})
    assert admitted.impact is None


def test_admit__intent_hash_binds_the_set__same_arguments_other_set_other_hash() -> None:
    narrow = admit_batch(batch_tool(lambda args, ctx: ["acct:1"]), ["1"])
    wide = admit_batch(batch_tool(lambda args, ctx: ["acct:1", "acct:2"]), ["1"])

    assert isinstance(narrow, Admitted) and isinstance(wide, Admitted)
    assert narrow.intent_hash != wide.intent_hash
    # ... and the worker's recomputation (no set given) finds the admitted hash
    tool = batch_tool(lambda args, ctx: ["acct:1"])
    assert compute_intent_hash(tool, narrow.arguments, CTX) == narrow.intent_hash


def test_admit__resources_hook_raises__business_rule_violation_nothing_quoted() -> None:
    def broken(args: BatchArgs, ctx: ServerContext) -> list[str]:
        raise RuntimeError(f"lookup of {args.ids[0]} failed")

    rejected = admit_batch(batch_tool(broken), ["SECRET-ID"])

    assert isinstance(rejected, Rejected)
    assert rejected.gate == "approval"
    assert rejected.result.error.code is ErrorCode.BUSINESS_RULE_VIOLATION
    assert "SECRET-ID" not in rejected.result.model_dump_json()


def test_admit__resources_hook_refuses_with_a_rule__its_safe_message() -> None:
    def refuses(args: BatchArgs, ctx: ServerContext) -> list[str]:
        raise BusinessRuleViolation("a batch may not mix regions")

    rejected = admit_batch(batch_tool(refuses), ["1"])

    assert isinstance(rejected, Rejected)
    assert rejected.result.error.code is ErrorCode.BUSINESS_RULE_VIOLATION
    assert rejected.result.error.message == "a batch may not mix regions"


def test_admit__more_resources_than_the_limit__invalid_arguments() -> None:
    rejected = admit_batch(batch_tool(), [str(n) for n in range(MAX_DECLARED_RESOURCES + 1)])

    assert isinstance(rejected, Rejected)
    assert rejected.result.error.code is ErrorCode.INVALID_ARGUMENTS
    assert [d.code for d in rejected.result.error.details] == ["resources"]
