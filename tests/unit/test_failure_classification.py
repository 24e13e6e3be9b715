"""classify_failure, row by row: each row names the behaviour it pins.

Pure: no database, no broker. The runner acts on these decisions (release_to_retry,
complete, mark_unknown, or the tool's lookup); here only the decision is checked.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from executor.core.tools import (
    Access,
    Approval,
    BusinessRuleViolation,
    Effect,
    LookupAnswer,
    LookupResult,
    Mode,
    RetryPolicy,
    RunContext,
    Tool,
    ToolFailure,
)
from executor.core.types import ErrorCode, ErrorDetail
from executor.worker.failures import (
    FailureDecision,
    Retry,
    RetryBudgetExhausted,
    Terminal,
    UnknownOutcome,
    classify_failure,
    rerun_within_budget,
)

BUDGET = 3  # retry.max_attempts of every tool below
WITHIN = 1  # an attempt that leaves budget
LAST = BUDGET  # the attempt that spends it


class DriverConnectionLost(Exception):
    """Stands for a database driver's error: a connection error only because the
    runner names it one (as it does SQLAlchemy's DBAPIError)."""


class FlakyUpstream(Exception):
    """An exception a tool declares in `retryable_exceptions`."""


CONNECTION_ERRORS: tuple[type[BaseException], ...] = (DriverConnectionLost, ConnectionError, OSError)


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoOutput(BaseModel):
    pass


def _not_done(args: NoArgs, ctx: RunContext) -> LookupResult:
    return LookupResult(LookupAnswer.NOT_DONE)


def tool(mode: Mode, *effects: Effect, retryable: tuple[type[BaseException], ...] = ()) -> Tool[Any]:
    return Tool(
        name=f"probe.{mode.value}.{'+'.join(sorted(effects)) or 'none'}",
        description="a declaration to classify against", mode=mode,
        input_model=NoArgs, output_model=NoOutput, run=lambda args, ctx: NoOutput(),
        access=Access.public_tool(), approval=Approval.never(), untrusted_output=False,
        **({"effect": effects} if mode is Mode.WRITE else {}),
        lookup=_not_done if Effect.LOOKUP in effects else None,
        retry=RetryPolicy(max_attempts=BUDGET), retryable_exceptions=retryable,
    )


READ = tool(Mode.READ)
IDEMPOTENT = tool(Mode.WRITE, Effect.IDEMPOTENT)
FENCED = tool(Mode.WRITE, Effect.FENCED)
LOOKUP = tool(Mode.WRITE, Effect.LOOKUP)
IDEMPOTENT_LOOKUP = tool(Mode.WRITE, Effect.IDEMPOTENT, Effect.LOOKUP)
UNSAFE = tool(Mode.WRITE, Effect.UNSAFE)
UNSAFE_FLAKY = tool(Mode.WRITE, Effect.UNSAFE, retryable=(FlakyUpstream,))
READ_FLAKY = tool(Mode.READ, retryable=(FlakyUpstream,))

DETAIL = ErrorDetail(path="amount_cents", code="too_large", expected="<= 100")


TIMEOUT_CAUSE = {"path": "", "code": "timeout", "expected": None}
DETAIL_DUMP = DETAIL.model_dump()


def retryable(code: ErrorCode = ErrorCode.UPSTREAM_UNAVAILABLE) -> ToolFailure:
    return ToolFailure(code, "the ledger is busy", retryable=True, details=(DETAIL,))


def terminal() -> ToolFailure:
    return ToolFailure(ErrorCode.EXECUTION_FAILED, "the account is closed", retryable=False)


def outcome_unknown(*, retryable: bool) -> ToolFailure:
    failure = ToolFailure(ErrorCode.TIMEOUT, "sent, no reply", retryable=retryable)
    failure.outcome_unknown = True
    return failure


RETRY_BUSY = Retry(ErrorCode.UPSTREAM_UNAVAILABLE, "the ledger is busy", (DETAIL.model_dump(),))
TERMINAL_CLOSED = Terminal(ErrorCode.EXECUTION_FAILED, "the account is closed")
UNAVAILABLE = Retry(ErrorCode.UPSTREAM_UNAVAILABLE, "the downstream is unavailable")
TIMED_OUT = Retry(ErrorCode.TIMEOUT, "the tool timed out")
RERUN_UNEXPECTED = Retry(ErrorCode.EXECUTION_FAILED, "the tool failed", unexpected=True)
READ_FAILED = Terminal(ErrorCode.EXECUTION_FAILED, "the tool failed", unexpected=True)

ROWS = [
    # ToolFailure: the tool said what happened, and its flag stands
    pytest.param(READ, retryable(), WITHIN, RETRY_BUSY,
                 id="tool_failure_retryable__read__retry_with_its_code_message_details"),
    pytest.param(UNSAFE, retryable(), WITHIN, RETRY_BUSY,
                 id="tool_failure_retryable__unsafe_write__retry_the_tool_says_it_did_not_act"),
    pytest.param(LOOKUP, retryable(), WITHIN, RETRY_BUSY,
                 id="tool_failure_retryable__lookup_write__retry"),
    pytest.param(READ, terminal(), WITHIN, TERMINAL_CLOSED,
                 id="tool_failure_terminal__read__terminal_with_its_code"),
    pytest.param(IDEMPOTENT, terminal(), WITHIN, TERMINAL_CLOSED,
                 id="tool_failure_terminal__idempotent_write__terminal_not_rerun"),
    pytest.param(UNSAFE, terminal(), WITHIN, TERMINAL_CLOSED,
                 id="tool_failure_terminal__unsafe_write__terminal"),
    pytest.param(FENCED, BusinessRuleViolation("over the limit", (DETAIL,)), WITHIN,
                 Terminal(ErrorCode.BUSINESS_RULE_VIOLATION, "over the limit", (DETAIL.model_dump(),)),
                 id="business_rule_violation__fenced_write__terminal_with_safe_details"),
    pytest.param(READ, terminal(), LAST, TERMINAL_CLOSED,
                 id="tool_failure_terminal__budget_spent__still_its_own_code"),
    # ToolFailure whose outcome is unknown: only a write that may not be rerun is held
    pytest.param(LOOKUP, outcome_unknown(retryable=True), WITHIN, UnknownOutcome(ask_lookup=True),
                 id="outcome_unknown__lookup_write__ask_the_lookup_even_if_marked_retryable"),
    pytest.param(UNSAFE, outcome_unknown(retryable=True), WITHIN, UnknownOutcome(ask_lookup=False),
                 id="outcome_unknown__unsafe_write__reconciliation_pending_never_rerun"),
    pytest.param(UNSAFE, outcome_unknown(retryable=False), LAST, UnknownOutcome(ask_lookup=False),
                 id="outcome_unknown__unsafe_write_budget_spent__still_held_for_a_person"),
    pytest.param(IDEMPOTENT, outcome_unknown(retryable=True), WITHIN,
                 Retry(ErrorCode.TIMEOUT, "sent, no reply"),
                 id="outcome_unknown__idempotent_write__retry_the_downstream_dedupes"),
    pytest.param(FENCED, outcome_unknown(retryable=False), WITHIN,
                 Terminal(ErrorCode.TIMEOUT, "sent, no reply"),
                 id="outcome_unknown__fenced_write_marked_terminal__terminal"),
    pytest.param(IDEMPOTENT_LOOKUP, outcome_unknown(retryable=True), WITHIN,
                 Retry(ErrorCode.TIMEOUT, "sent, no reply"),
                 id="outcome_unknown__idempotent_and_lookup_write__retry_without_asking"),
    pytest.param(READ, outcome_unknown(retryable=True), WITHIN, Retry(ErrorCode.TIMEOUT, "sent, no reply"),
                 id="outcome_unknown__read__retry_a_read_has_no_effect"),
    # TimeoutError: retryable for a read and for a write a repeat cannot double; for an
    # `unsafe` or `lookup` write the request may have left: an unknown outcome
    pytest.param(READ, TimeoutError(), WITHIN, TIMED_OUT, id="timeout__read__retry_as_timeout"),
    pytest.param(FENCED, TimeoutError(), WITHIN, TIMED_OUT, id="timeout__fenced_write__retry_as_timeout"),
    pytest.param(UNSAFE, TimeoutError(), WITHIN,
                 UnknownOutcome(ask_lookup=False, details=(TIMEOUT_CAUSE,)),
                 id="timeout__unsafe_write__unknown_outcome_never_resent"),
    pytest.param(LOOKUP, TimeoutError(), WITHIN,
                 UnknownOutcome(ask_lookup=True, details=(TIMEOUT_CAUSE,)),
                 id="timeout__lookup_write__unknown_outcome_ask_the_downstream"),
    # the tool's own retryable_exceptions
    pytest.param(READ_FLAKY, FlakyUpstream(), WITHIN, UNAVAILABLE,
                 id="declared_retryable_exception__read__retry_as_upstream_unavailable"),
    pytest.param(UNSAFE_FLAKY, FlakyUpstream(), WITHIN, UNAVAILABLE,
                 id="declared_retryable_exception__unsafe_write__retry_the_author_declared_it_safe"),
    pytest.param(UNSAFE, FlakyUpstream(), WITHIN, UnknownOutcome(ask_lookup=False, unexpected=True),
                 id="undeclared_exception__unsafe_write__unknown_outcome"),
    # connection errors: a read retries, a write's outcome is unknown
    pytest.param(READ, ConnectionError("reset"), WITHIN, UNAVAILABLE,
                 id="connection_error__read__retry_as_upstream_unavailable"),
    pytest.param(READ, DriverConnectionLost(), WITHIN, UNAVAILABLE,
                 id="driver_error_named_by_the_runner__read__retry_as_upstream_unavailable"),
    pytest.param(READ, OSError("no route to host"), WITHIN, UNAVAILABLE,
                 id="os_error__read__retry_as_upstream_unavailable"),
    pytest.param(UNSAFE, ConnectionError("reset"), WITHIN, UnknownOutcome(ask_lookup=False, unexpected=True),
                 id="connection_error__unsafe_write__unknown_outcome_for_a_person"),
    pytest.param(LOOKUP, DriverConnectionLost(), WITHIN, UnknownOutcome(ask_lookup=True, unexpected=True),
                 id="driver_error__lookup_write__unknown_outcome_ask_the_lookup"),
    pytest.param(IDEMPOTENT, ConnectionError("reset"), WITHIN, RERUN_UNEXPECTED,
                 id="connection_error__idempotent_write__rerun_as_execution_failed"),
    # anything else is unexpected (logged with its traceback)
    pytest.param(READ, ValueError("bug"), WITHIN, READ_FAILED,
                 id="unexpected__read__terminal_execution_failed"),
    pytest.param(IDEMPOTENT, ValueError("bug"), WITHIN, RERUN_UNEXPECTED,
                 id="unexpected__idempotent_write__rerun_the_downstream_dedupes"),
    pytest.param(FENCED, KeyError("bug"), WITHIN, RERUN_UNEXPECTED,
                 id="unexpected__fenced_write__rerun_the_downstream_fences"),
    pytest.param(LOOKUP, ValueError("bug"), WITHIN, UnknownOutcome(ask_lookup=True, unexpected=True),
                 id="unexpected__lookup_write__unknown_outcome_ask_the_lookup"),
    pytest.param(UNSAFE, ValueError("bug"), WITHIN, UnknownOutcome(ask_lookup=False, unexpected=True),
                 id="unexpected__unsafe_write__unknown_outcome_for_a_person"),
    # the retry budget: a retryable failure on its last attempt gives up with its code
    pytest.param(READ, retryable(), LAST,
                 RetryBudgetExhausted(ErrorCode.UPSTREAM_UNAVAILABLE, LAST, (DETAIL_DUMP,)),
                 id="tool_failure_retryable__budget_spent__retry_budget_exhausted_keeps_details"),
    pytest.param(READ, retryable(), LAST + 1,
                 RetryBudgetExhausted(ErrorCode.UPSTREAM_UNAVAILABLE, LAST + 1, (DETAIL_DUMP,)),
                 id="tool_failure_retryable__past_the_budget__retry_budget_exhausted"),
    pytest.param(READ, TimeoutError(), LAST, RetryBudgetExhausted(ErrorCode.TIMEOUT, LAST),
                 id="timeout__budget_spent__retry_budget_exhausted_naming_timeout"),
    pytest.param(READ, ConnectionError(), LAST, RetryBudgetExhausted(ErrorCode.UPSTREAM_UNAVAILABLE, LAST),
                 id="connection_error__read_budget_spent__retry_budget_exhausted"),
    pytest.param(IDEMPOTENT, ValueError("bug"), LAST,
                 RetryBudgetExhausted(ErrorCode.EXECUTION_FAILED, LAST, unexpected=True),
                 id="unexpected__idempotent_write_budget_spent__retry_budget_exhausted"),
    pytest.param(READ, retryable(), BUDGET - 1, RETRY_BUSY,
                 id="tool_failure_retryable__one_attempt_left__retry"),
]


@pytest.mark.parametrize(("declared", "exc", "attempts", "expected"), ROWS)
def test_classify_failure(
    declared: Tool[Any], exc: BaseException, attempts: int, expected: FailureDecision
) -> None:
    decision = classify_failure(exc, declared, attempts=attempts, connection_errors=CONNECTION_ERRORS)
    assert decision == expected


def test_classify_failure__driver_error_not_named_a_connection_error__read_ends_terminal() -> None:
    # The runner's tuple decides: the same exception, not named, is unexpected.
    decision = classify_failure(DriverConnectionLost(), READ, attempts=WITHIN, connection_errors=())
    assert decision == READ_FAILED


def test_retry_budget_exhausted__message_names_attempts_and_code() -> None:
    decision = RetryBudgetExhausted(ErrorCode.TIMEOUT, 5)
    assert decision.message == "gave up after 5 attempts (timeout)"


@pytest.mark.parametrize(
    ("attempts", "expected"),
    [
        pytest.param(WITHIN, Retry(ErrorCode.EXECUTION_FAILED, "the tool failed"),
                     id="lookup_says_not_done__within_budget__rerun"),
        pytest.param(LAST, RetryBudgetExhausted(ErrorCode.EXECUTION_FAILED, LAST),
                     id="lookup_says_not_done__budget_spent__retry_budget_exhausted"),
    ],
)
def test_rerun_within_budget(attempts: int, expected: FailureDecision) -> None:
    assert rerun_within_budget(LOOKUP, attempts=attempts) == expected


def test_failures_module__imports_no_database_or_broker() -> None:
    probe = (
        "import sys, executor.worker.failures; "
        "print(sorted(m for m in ('sqlalchemy', 'psycopg', 'celery', 'kombu', 'redis') if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"


class ValueRefused(DriverConnectionLost):
    """Stands for a driver error the runner's `bad_data` names a refused value."""


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, ValueRefused)


REFUSED_TERMINAL = Terminal(
    ErrorCode.INVALID_ARGUMENTS, "the database refused a value of this call",
    ({"path": "", "code": "refused_by_database", "expected": "values the database can hold"},),
)


@pytest.mark.parametrize(
    ("declared", "exc", "expected"),
    [
        pytest.param(READ, ValueRefused(), REFUSED_TERMINAL,
                     id="read__value_refused__terminal_invalid_arguments_not_retried"),
        pytest.param(READ, DriverConnectionLost(), Retry(
            ErrorCode.UPSTREAM_UNAVAILABLE, "the downstream is unavailable"),
                     id="read__connection_lost__still_retried"),
        pytest.param(UNSAFE, ValueRefused(), UnknownOutcome(ask_lookup=False, unexpected=True),
                     id="unsafe_write__value_refused__may_have_acted_before__unknown_outcome"),
    ],
)
def test_classify_failure__bad_data(
    declared: Tool[Any], exc: BaseException, expected: FailureDecision
) -> None:
    decision = classify_failure(
        exc, declared, attempts=WITHIN, connection_errors=CONNECTION_ERRORS, bad_data=_refused
    )
    assert decision == expected
