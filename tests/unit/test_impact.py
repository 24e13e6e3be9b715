"""The impact an approver decides on (executor/core/impact.py, decision 0222): the
tool's hook on current state, its digest, and what happens when it cannot be
computed."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from executor import Access, Amount, Approval, ApproverPolicy, Effect, Mode, ServerContext, Tool
from executor.core.impact import ImpactUnavailable, current_impact, impact_digest
from executor.core.tools import ToolDeclarationError

CTX = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="r1")


class Pay(BaseModel):
    model_config = ConfigDict(extra="forbid")
    account: str
    cents: int


BALANCE = {"acme-1": 10_000}


def _impact(args: Pay, ctx: ServerContext) -> dict[str, Any]:
    if args.account == "boom":
        raise RuntimeError("the ledger is down")
    return {"balance_cents": BALANCE[args.account], "cents": args.cents, "who": ctx.principal}


def _tool(**extra: Any) -> Tool[Pay]:
    return Tool(
        name="pay", description="pay", mode=Mode.WRITE, input_model=Pay, output_model=Pay,
        run=lambda a, c: a, access=Access.for_roles("member"), approval=Approval.always(),
        approvers=ApproverPolicy.for_roles("approver"), effect=[Effect.FENCED], untrusted_output=False,
        **extra,
    )


def test_current_impact__reads_state_now__digest_follows_the_figures() -> None:
    # Given a tool whose impact reads a balance, and a call of it
    tool = _tool(impact=_impact)
    call = {"account": "acme-1", "cents": 700}
    # When the impact is computed, the balance moves, and it is computed again
    before = current_impact(tool, call, CTX, None)
    BALANCE["acme-1"] = 9_000
    try:
        after = current_impact(tool, call, CTX, ["account:acme-1"])
    finally:
        BALANCE["acme-1"] = 10_000
    # Then each reads the balance as it was then, on the requester's context
    assert before == {"balance_cents": 10_000, "cents": 700, "who": "alice"}
    assert after["balance_cents"] == 9_000
    # And the approved set is added as admission adds it
    assert after["resources"] == ["account:acme-1"] and after["resource_count"] == 1
    # And the digest changes with a figure, never with key order
    assert impact_digest(before) != impact_digest({**before, "balance_cents": 9_999})
    assert impact_digest({"b": 1, "a": 2}) == impact_digest({"a": 2, "b": 1})
    assert len(impact_digest(before)) == 32


def test_current_impact__hook_fails_or_arguments_no_longer_validate__unavailable() -> None:
    tool = _tool(impact=_impact)
    with pytest.raises(ImpactUnavailable):
        current_impact(tool, {"account": "boom", "cents": 1}, CTX, None)
    with pytest.raises(ImpactUnavailable):
        current_impact(tool, {"account": "acme-1", "cents": "many"}, CTX, None)


def test_current_impact__no_hook__the_redacted_default_summary() -> None:
    impact = current_impact(_tool(), {"account": "acme-1", "cents": 5}, CTX, None)
    assert impact["arguments"] == {"account": "<text, 6 characters>", "cents": 5}


def test_amounts__declared_hints_kept__anything_else_refused() -> None:
    assert _tool(amounts={"cents": Amount("EUR", 2)}).amounts == {"cents": Amount("EUR", 2)}
    assert _tool().amounts == {}
    with pytest.raises(ToolDeclarationError, match="Amount hints"):
        _tool(amounts={"cents": "EUR"})
