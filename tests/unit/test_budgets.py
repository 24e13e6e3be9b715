"""Budgets, the proposal fingerprint and the conversation scope of the server context:
pure decisions, no database."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from executor.core.admission import Admitted, admit, proposal_fingerprint
from executor.core.budgets import (
    Budget,
    BudgetLimits,
    Budgets,
    Scope,
    Usage,
    exceeded,
    refusal,
)
from executor.core.tools import Access, Approval, Mode, Registry, Tool, ToolDeclarationError
from executor.core.types import ErrorCode, ProposedCall, ServerContext
from executor.settings import Settings, SettingsError

LIMITS = BudgetLimits(max_calls=4, max_writes=2, max_calls_per_tool=3, max_repeated_failures=1)


def usage(calls: int = 0, writes: int = 0, tool_calls: int = 0, failures: int = 0) -> Usage:
    return Usage(calls=calls, writes=writes, tool_calls=tool_calls, repeated_failures=failures)


@pytest.mark.parametrize(
    ("used", "is_write", "tool_limit", "expected"),
    [
        (usage(calls=3, writes=1, tool_calls=2), True, None, None),
        (usage(calls=4), False, None, Budget.MAX_CALLS),
        (usage(calls=2, writes=2), True, None, Budget.MAX_WRITES),
        (usage(calls=2, writes=2), False, None, None),
        (usage(calls=3, tool_calls=3), False, None, Budget.MAX_CALLS_PER_TOOL),
        (usage(calls=1, tool_calls=1), False, 1, Budget.MAX_CALLS_PER_TOOL),
        (usage(calls=3, tool_calls=3), False, 10, None),
        (usage(failures=1), False, None, Budget.MAX_REPEATED_FAILURES),
    ],
)
def test_exceeded__one_more_call__names_the_first_limit_it_breaks(
    used: Usage, is_write: bool, tool_limit: int | None, expected: Budget | None
) -> None:
    over = exceeded(Scope.REQUEST, LIMITS, used, is_write=is_write, tool_limit=tool_limit)
    assert (over.budget if over else None) == expected


def test_refusal__names_scope_and_limit__not_what_was_counted() -> None:
    over = exceeded(Scope.CONVERSATION, LIMITS, usage(calls=4), is_write=False, tool_limit=None)
    assert over is not None
    result = refusal("c1", "t", over)
    assert result.error.code is ErrorCode.CALL_BUDGET_EXCEEDED
    [detail] = result.error.details
    assert (detail.path, detail.code, detail.expected) == ("conversation", "max_calls", "<= 4")


def test_budgets__tenant_override__replaces_only_named_keys() -> None:
    base = Budgets()
    acme = base.with_overrides({"request_max_calls": 2, "conversation_max_writes": 7})
    budgets = Budgets(tenants={"acme": acme})
    assert budgets.for_tenant("acme").request.max_calls == 2
    assert budgets.for_tenant("acme").request.max_writes == base.request.max_writes
    assert budgets.for_tenant("acme").conversation.max_writes == 7
    assert budgets.for_tenant("globex") is budgets
    with pytest.raises(ValueError, match="request_max_call"):
        base.with_overrides({"request_max_call": 2})


def test_settings__budgets_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFENCE_BUDGET_REQUEST_MAX_CALLS", "5")
    monkeypatch.setenv("TOOLFENCE_BUDGET_TENANTS", '{"acme": {"conversation_max_calls_per_tool": 2}}')
    budgets = Settings.from_env().budgets
    assert budgets.request.max_calls == 5
    assert budgets.for_tenant("acme").request.max_calls == 5
    assert budgets.for_tenant("acme").conversation.max_calls_per_tool == 2


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TOOLFENCE_BUDGET_REQUEST_MAX_WRITES", "-1"),
        ("TOOLFENCE_BUDGET_REQUEST_MAX_WRITES", "many"),
        ("TOOLFENCE_BUDGET_TENANTS", "[1]"),
        ("TOOLFENCE_BUDGET_TENANTS", '{"acme": {"nonsense": 1}}'),
    ],
)
def test_settings__bad_budget__settings_error(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError):
        Settings.from_env()


# ------------------------------------------------------------------ fingerprint


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


TOOL = Tool(
    name="t", description="t", mode=Mode.READ, input_model=Args, output_model=Args,
    untrusted_output=False,
    run=lambda args, ctx: args, access=Access.public_tool(), approval=Approval.never(),
)
REGISTRY = Registry([TOOL])
CTX = ServerContext(principal="p", tenant="acme", request_id="r")


def test_fingerprint__admitted_call__equals_its_intent_hash() -> None:
    call = ProposedCall(call_id="c", tool_name="t", arguments='{"n": 1}')
    decision = admit(call, REGISTRY, CTX)
    assert isinstance(decision, Admitted)
    assert proposal_fingerprint(call, REGISTRY, CTX) == decision.intent_hash


def test_fingerprint__spelling_does_not_matter__meaning_and_principal_do() -> None:
    def fp(arguments: str, ctx: ServerContext = CTX) -> str:
        call = ProposedCall(call_id="c", tool_name="t", arguments=arguments)
        return proposal_fingerprint(call, REGISTRY, ctx)

    assert fp('{"n": 1}') == fp('{ "n" :1 }')
    assert fp('{"n": 1}') != fp('{"n": 2}')
    assert fp('{"n": 1}') != fp('{"n": 1}', CTX.model_copy(update={"principal": "q"}))
    # A call no gate could read is fingerprinted by its text.
    assert fp("{broken") == fp("{broken") != fp("{broken!")


def test_fingerprint__unknown_tool_or_bytes__stable_and_fits_the_column() -> None:
    call = ProposedCall(call_id="c", tool_name="nope", arguments=b"\xff\xfe")
    assert proposal_fingerprint(call, REGISTRY, CTX) == proposal_fingerprint(call, REGISTRY, CTX)
    assert len(proposal_fingerprint(call, REGISTRY, CTX)) <= 64


# ------------------------------------------------------------------ context and tools


def test_server_context__conversation_and_turn__round_trip_and_default_none() -> None:
    ctx = ServerContext(principal="p", tenant="t", request_id="r", conversation_id="conv", turn_id="3")
    assert ServerContext.from_json(ctx.to_json()) == ctx
    older = {"principal": "p", "tenant": "t", "roles": [], "request_id": "r"}
    assert ServerContext.from_json(older).conversation_id is None


def test_tool__budget_must_be_a_tool_budget() -> None:
    with pytest.raises(ToolDeclarationError, match="ToolBudget"):
        Tool(
            name="t", description="t", mode=Mode.READ, input_model=Args, output_model=Args,
            untrusted_output=False,
            run=lambda args, ctx: args, access=Access.public_tool(), approval=Approval.never(),
            budget=3,  # type: ignore[arg-type]
        )
