"""Call budgets: how much one request and one conversation may propose (pure).

A model in a loop proposes the same few calls again and again; a budget ends
that before anything more is stored as runnable. The producer counts what a
scope already holds from the database, inside its own transaction, and asks
`exceeded` whether one more call fits; this module only decides.

Limits come from settings (`TOOLFENCE_BUDGET_*`), per tenant from
`TOOLFENCE_BUDGET_TENANTS`, and per tool from the tool's `budget` field (the
per-tool limit only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Loaded by `refusal`: the settings declare the budgets from this module, and the
    # CLI's parsers read those declarations without pydantic (executor/cli/args.py).
    from executor.core.types import FailedTerminal


class Scope(StrEnum):
    REQUEST = "request"
    CONVERSATION = "conversation"


class Budget(StrEnum):
    """Which limit a call would break: the `code` of the refusal's detail."""

    MAX_CALLS = "max_calls"
    MAX_WRITES = "max_writes"
    MAX_CALLS_PER_TOOL = "max_calls_per_tool"
    MAX_REPEATED_FAILURES = "max_repeated_failures"


@dataclass(frozen=True)
class BudgetLimits:
    """The limits of one scope. `max_repeated_failures`: once this many calls of the
    scope were answered `repeated_failed_call`, the model is looping on a failure and
    every further call is refused."""

    max_calls: int
    max_writes: int
    max_calls_per_tool: int
    max_repeated_failures: int

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"budget {f.name} must be >= 0")


DEFAULT_REQUEST = BudgetLimits(max_calls=32, max_writes=16, max_calls_per_tool=8, max_repeated_failures=3)
DEFAULT_CONVERSATION = BudgetLimits(
    max_calls=256, max_writes=64, max_calls_per_tool=64, max_repeated_failures=5
)


@dataclass(frozen=True)
class ToolBudget:
    """A tool's own per-tool limit, replacing `max_calls_per_tool` for it (None: keep)."""

    per_request: int | None = None
    per_conversation: int | None = None


@dataclass(frozen=True)
class Budgets:
    """Default limits per scope, and whole replacements per tenant."""

    request: BudgetLimits = DEFAULT_REQUEST
    conversation: BudgetLimits = DEFAULT_CONVERSATION
    tenants: Mapping[str, Budgets] = field(default_factory=dict)

    def for_tenant(self, tenant: str) -> Budgets:
        return self.tenants.get(tenant, self)

    def limits(self, scope: Scope) -> BudgetLimits:
        return self.request if scope is Scope.REQUEST else self.conversation

    def with_overrides(self, overrides: Mapping[str, Any]) -> Budgets:
        """These limits with some replaced: keys `request_max_calls`,
        `conversation_max_writes`, … (the `TOOLFENCE_BUDGET_*` names, lower case)."""
        known = {f"{scope.value}_{f.name}" for scope in Scope for f in fields(BudgetLimits)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown budget keys: {', '.join(unknown)}")
        changed: dict[str, BudgetLimits] = {}
        for scope in Scope:
            prefix = f"{scope.value}_"
            values = {k[len(prefix):]: int(v) for k, v in overrides.items() if k.startswith(prefix)}
            changed[scope.value] = replace(self.limits(scope), **values)
        return Budgets(request=changed["request"], conversation=changed["conversation"])


@dataclass(frozen=True)
class Usage:
    """What a scope already holds (calls refused by a budget are not counted)."""

    calls: int
    writes: int
    tool_calls: int
    repeated_failures: int


@dataclass(frozen=True)
class Exceeded:
    scope: Scope
    budget: Budget
    limit: int


def exceeded(
    scope: Scope, limits: BudgetLimits, usage: Usage, *, is_write: bool, tool_limit: int | None
) -> Exceeded | None:
    """Would one more call (a write if `is_write`) break a limit of this scope?"""
    if usage.repeated_failures >= limits.max_repeated_failures:
        return Exceeded(scope, Budget.MAX_REPEATED_FAILURES, limits.max_repeated_failures)
    if usage.calls + 1 > limits.max_calls:
        return Exceeded(scope, Budget.MAX_CALLS, limits.max_calls)
    if is_write and usage.writes + 1 > limits.max_writes:
        return Exceeded(scope, Budget.MAX_WRITES, limits.max_writes)
    per_tool = limits.max_calls_per_tool if tool_limit is None else tool_limit
    if usage.tool_calls + 1 > per_tool:
        return Exceeded(scope, Budget.MAX_CALLS_PER_TOOL, per_tool)
    return None


def refusal(call_id: str, tool_name: str, over: Exceeded) -> FailedTerminal:
    from executor.core.types import ErrorCode, ErrorDetail, FailedTerminal, ToolError

    """The caller's terminal result: which scope and budget, never what was counted."""
    return FailedTerminal(
        call_id=call_id,
        tool_name=tool_name,
        error=ToolError(
            code=ErrorCode.CALL_BUDGET_EXCEEDED,
            message=f"this {over.scope.value} has used its call budget ({over.budget.value})",
            details=(
                ErrorDetail(path=over.scope.value, code=over.budget.value, expected=f"<= {over.limit}"),
            ),
        ),
    )
