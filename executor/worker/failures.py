"""What to do when a tool's `run` raised: a pure decision, acted on by the runner.

The decision depends only on the exception, the tool's declaration (mode,
effects, `retryable_exceptions`, retry budget) and how many attempts were made.
It imports no database or broker: the runner names the exception types it treats
as a lost connection (its driver's among them) in `connection_errors`, and which
of them are a value the database refused in `bad_data` (decision 0193).

The rules, in order (the first that matches decides):

1. A `ToolFailure` marked `outcome_unknown` from a write that may not simply be
   rerun (`lookup`, `unsafe`): the downstream may have acted, so never retry it
   blindly; ask its lookup, or leave it to a person.
2. A `ToolFailure`: the tool said what happened; its code and `retryable` stand.
3. A `TimeoutError`: `timeout`, retryable.
4. One of the tool's own `retryable_exceptions`: `upstream_unavailable`, retryable.
5. A database's refusal of a value from a read (`bad_data`: SQLSTATE class 22, 23,
   54, a NUL in text): `invalid_arguments` (detail `refused_by_database`),
   terminal: the same statement is refused on every try. Any other connection
   error from a read: `upstream_unavailable`, retryable (a read may always be
   retried; a write's is an unknown outcome, below). A write's handler may have
   acted before its statement was refused, which the runner cannot know: a write
   that proves it did nothing says so with a `ToolFailure` (the reference
   ledger's: its transaction rolled back).
6. Anything else is unexpected. A read ends `execution_failed`. A write's outcome
   is unknown: rerun it if the downstream dedupes or fences (`idempotent`,
   `fenced`), else as in rule 1.

A retryable failure is retried only within the tool's budget; once `attempts`
reaches `retry.max_attempts` the operation ends `retry_budget_exhausted`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from executor.core.admission import REFUSED_BY_DATABASE
from executor.core.tools import Effect, Mode, Tool, ToolFailure
from executor.core.types import ErrorCode


@dataclass(frozen=True, kw_only=True)
class _Decision:
    # The exception was none the tool declares (a bug, or a failure it did not
    # foresee): the runner logs its traceback for the tool's author.
    unexpected: bool = False


@dataclass(frozen=True)
class Retry(_Decision):
    """Back to `retry_wait` with backoff: repeating is safe and the budget allows it."""

    code: ErrorCode
    message: str
    details: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Terminal(_Decision):
    """`failed_terminal` with the failure's own code: trying again cannot help."""

    code: ErrorCode
    message: str
    details: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class RetryBudgetExhausted(_Decision):
    """Retryable, but the tool's budget is spent: `failed_terminal`,
    `retry_budget_exhausted`, naming the code that would have been retried."""

    code: ErrorCode
    attempts: int
    details: tuple[dict[str, Any], ...] = ()

    @property
    def message(self) -> str:
        return f"gave up after {self.attempts} attempts ({self.code.value})"


@dataclass(frozen=True)
class UnknownOutcome(_Decision):
    """A write that may not be rerun may have acted. With a lookup the runner asks the
    downstream; without one (or when it cannot answer) `reconciliation_pending`."""

    ask_lookup: bool
    # The failure's own safe details (an MCP call's cause, `mcp_timeout`), kept on the
    # operation for the person who decides it.
    details: tuple[dict[str, Any], ...] = ()


FailureDecision = Retry | Terminal | RetryBudgetExhausted | UnknownOutcome

def retry_within_budget(
    code: ErrorCode,
    message: str,
    details: tuple[dict[str, Any], ...] = (),
    *,
    attempts: int,
    max_attempts: int,
    unexpected: bool = False,
) -> Retry | RetryBudgetExhausted:
    """A retryable failure: `Retry` while attempts remain, else `RetryBudgetExhausted`."""
    if attempts >= max_attempts:
        return RetryBudgetExhausted(code, attempts, details, unexpected=unexpected)
    return Retry(code, message, details, unexpected=unexpected)


def rerun_within_budget(
    tool: Tool[Any], *, attempts: int, unexpected: bool = False
) -> Retry | RetryBudgetExhausted:
    """Run a write again (`execution_failed` while it waits): its downstream converges on
    a repeat (`idempotent`, `fenced`), or its lookup said the effect did not happen."""
    return retry_within_budget(
        ErrorCode.EXECUTION_FAILED, "the tool failed", attempts=attempts,
        max_attempts=tool.retry.max_attempts, unexpected=unexpected,
    )


def classify_failure(
    exc: BaseException,
    tool: Tool[Any],
    *,
    attempts: int,
    connection_errors: tuple[type[BaseException], ...],
    bad_data: Callable[[BaseException], bool] = lambda exc: False,
) -> FailureDecision:
    """Decide what an exception from `tool.run` means (the rules in the module docstring).

    `attempts` counts this one (the reservation's attempt number).
    """

    def retry(
        code: ErrorCode, message: str, details: tuple[dict[str, Any], ...] = ()
    ) -> Retry | RetryBudgetExhausted:
        return retry_within_budget(
            code, message, details, attempts=attempts, max_attempts=tool.retry.max_attempts
        )

    may_have_acted = tool.mode is Mode.WRITE and not tool.takeover_allowed
    if isinstance(exc, ToolFailure):
        details = tuple(detail.model_dump() for detail in exc.details)
        if exc.outcome_unknown and may_have_acted:
            return _unknown_outcome(tool, details)
        if exc.retryable:
            return retry(exc.code, exc.message, details)
        return Terminal(exc.code, exc.message, details)
    if isinstance(exc, TimeoutError):
        if may_have_acted:
            # Timed out after the request may have left: for an `unsafe` or `lookup`
            # write that is an unknown outcome, never a reason to send it again.
            return _unknown_outcome(tool, ({"path": "", "code": "timeout", "expected": None},))
        return retry(ErrorCode.TIMEOUT, "the tool timed out")
    if tool.retryable_exceptions and isinstance(exc, tool.retryable_exceptions):
        return retry(ErrorCode.UPSTREAM_UNAVAILABLE, "the downstream is unavailable")
    if tool.mode is Mode.READ and isinstance(exc, connection_errors) and bad_data(exc):
        # The database refused a value of the call: trying again is refused again.
        return Terminal(
            ErrorCode.INVALID_ARGUMENTS, "the database refused a value of this call",
            (REFUSED_BY_DATABASE.model_dump(),),
        )
    if tool.mode is Mode.READ and isinstance(exc, connection_errors):
        # A lost connection is no reason to end a read `failed_terminal`.
        return retry(ErrorCode.UPSTREAM_UNAVAILABLE, "the downstream is unavailable")
    if tool.mode is Mode.READ:
        return Terminal(ErrorCode.EXECUTION_FAILED, "the tool failed", unexpected=True)
    if tool.takeover_allowed:
        return rerun_within_budget(tool, attempts=attempts, unexpected=True)
    return _unknown_outcome(tool, unexpected=True)


def _unknown_outcome(
    tool: Tool[Any], details: tuple[dict[str, Any], ...] = (), *, unexpected: bool = False
) -> UnknownOutcome:
    can_answer = Effect.LOOKUP in tool.effects and tool.lookup is not None
    return UnknownOutcome(ask_lookup=can_answer, details=details, unexpected=unexpected)
