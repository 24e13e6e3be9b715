"""The loop's decision (pure): given the steps recorded so far and the statuses of
the last step's calls, what the turn does next.

The worker's turn job (`executor.worker.turns`) only performs what this
returns; every branch is here, so a reader checks the loop without I/O:

- no step yet, or the last step's calls all settled → ask the model for the
  next step, unless `max_steps` is spent (the turn ends `fallback`);
- the last step proposed calls → enqueue them (idempotent: a resumed turn
  re-enqueues the same operations and finds their results), unless the turn's
  calls would pass `max_calls` (`fallback`, `call_budget_exceeded`);
- some call still queued or running → wait for it; only calls waiting for a
  person left → wait for approval (no owner meanwhile), or, in a surface whose
  writes become approval cards (`cards`), end `succeeded` with the cards as the
  answer (`approval_card`): the write runs after a person approves, outside the
  turn, and the answer says it has not happened;
- a call refused `call_budget_exceeded` (the request's or conversation's
  budget) → `fallback`: the budget is spent, asking the model again cannot help;
- a final answer → the audit hook, when the turn has one, else `succeeded`;
  nothing more to do → `succeeded` with an empty answer; a contract error →
  `fallback`, the reason recorded (`response_refused` when the surface's adapter
  refused the provider's response: truncated, paused, filtered, failed);
- the step's response held a hosted call the application's hosted policy refused
  (`hosted_call_not_allowed`) or routed to an approval a turn cannot answer
  (`hosted_approval_required`) → `fallback`, before any of its calls is enqueued:
  its answer was built on what the provider ran;
- after an audit: emit → `succeeded` with the candidate; the audit failed →
  `succeeded` with the candidate, `audit_failed` recorded; suppress →
  `fallback`; ask the user → `succeeded` with the audit's question; deny and
  read → its read calls run like a step's, then the model answers again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from executor.core.states import State, TurnState
from executor.core.types import CallStatus, ErrorCode, FailedRetryable, FailedTerminal, Pending
from executor.turns.audit import Verdict
from executor.turns.contract import PROVIDER
from executor.turns.values import EndReason, StepOutcome, StepRecord, TurnOptions

HOSTED = "hosted"
"""The `source` of a step's error when the provider ran hosted calls the turn cannot
accept: its `code` is the end reason (`hosted_call_not_allowed`,
`hosted_approval_required`)."""
HOSTED_STOPS = frozenset({EndReason.HOSTED_CALL_NOT_ALLOWED, EndReason.HOSTED_APPROVAL_REQUIRED})


@dataclass(frozen=True)
class CallModel:
    step: int
    call_index: int  # the model's calls in this turn so far + 1


@dataclass(frozen=True)
class Audit:
    step: int
    candidate: StepRecord
    call_index: int


@dataclass(frozen=True)
class Enqueue:
    step: StepRecord


@dataclass(frozen=True)
class AwaitCalls:
    step: StepRecord


@dataclass(frozen=True)
class WaitApproval:
    step: StepRecord


@dataclass(frozen=True)
class End:
    state: TurnState
    reason: EndReason
    output: str | None = None


Action = CallModel | Audit | Enqueue | AwaitCalls | WaitApproval | End


def model_steps(steps: Sequence[StepRecord]) -> list[StepRecord]:
    return [s for s in steps if s.outcome is not StepOutcome.AUDIT]


def _calls_proposed(steps: Sequence[StepRecord]) -> int:
    return sum(len(s.proposals) for s in steps)


def _has_calls(step: StepRecord) -> bool:
    return step.outcome is StepOutcome.TOOL_CALLS or (
        step.outcome is StepOutcome.AUDIT and step.verdict == Verdict.DENY_AND_READ.value
    )


def next_action(
    steps: Sequence[StepRecord],
    statuses: Sequence[CallStatus] | None,
    options: TurnOptions,
    *,
    cards: bool = False,
) -> Action:
    """What to do next. `statuses`: one per call of the last step, once its calls are
    enqueued (None before). `cards`: the turn's surface turns writes into approval
    cards, so a call waiting for a person ends the turn with its card."""
    if not steps:
        return CallModel(1, 1)
    model = model_steps(steps)
    audits = len(steps) - len(model)
    last = steps[-1]
    if last.outcome is StepOutcome.AUDIT and not _has_calls(last):
        return _after_audit(last, model[-1])
    stop = _hosted_stop(last)
    if stop is not None:
        return End(TurnState.FALLBACK, stop)
    if last.outcome is StepOutcome.FINAL:
        if options.audit_driver:
            return Audit(last.step + 1, last, audits + 1)
        return End(TurnState.SUCCEEDED, EndReason.FINAL, last.final_output or "")
    if last.outcome is StepOutcome.NOTHING:
        return End(TurnState.SUCCEEDED, EndReason.NOTHING_MORE, "")
    if last.outcome is StepOutcome.CONTRACT_ERROR:
        refused = (last.error or {}).get("source") == PROVIDER
        return End(TurnState.FALLBACK, EndReason.RESPONSE_REFUSED if refused else EndReason.CONTRACT_ERROR)
    # The last step has calls: a model step's, or an audit's reads.
    if statuses is None:
        if _calls_proposed(steps) > options.max_calls:
            return End(TurnState.FALLBACK, EndReason.CALL_BUDGET_EXCEEDED)
        return Enqueue(last)
    if any(_budget_refused(s) for s in statuses):
        return End(TurnState.FALLBACK, EndReason.CALL_BUDGET_EXCEEDED)
    waiting = [s for s in statuses if isinstance(s, Pending)]
    if any(s.state not in (State.PENDING_APPROVAL.value, State.RECONCILIATION_PENDING.value)
           for s in waiting):
        return AwaitCalls(last)
    if any(s.state == State.PENDING_APPROVAL.value for s in waiting):
        if cards:
            return End(TurnState.SUCCEEDED, EndReason.APPROVAL_CARD, card_answer(statuses))
        return WaitApproval(last)
    # Every call terminal, or `reconciliation_pending` (the model is told the outcome is
    # unknown; a person decides it, the turn does not wait for that person).
    if len(model) >= options.max_steps:
        return End(TurnState.FALLBACK, EndReason.MAX_STEPS)
    return CallModel(last.step + 1, len(model) + 1)


def _hosted_stop(step: StepRecord) -> EndReason | None:
    error = step.error or {}
    if step.outcome is StepOutcome.AUDIT or error.get("source") != HOSTED:
        return None
    code = error.get("code")
    # Fail closed: a hosted stop of a code this version does not know still stops.
    known = (reason for reason in HOSTED_STOPS if reason.value == code)
    return next(known, EndReason.HOSTED_CALL_NOT_ALLOWED)


def _after_audit(audit: StepRecord, candidate: StepRecord) -> End:
    verdict = Verdict(audit.verdict or Verdict.FAILED.value)
    text = candidate.final_output or ""
    if verdict is Verdict.EMIT:
        return End(TurnState.SUCCEEDED, EndReason.FINAL, text)
    if verdict is Verdict.SUPPRESS:
        return End(TurnState.FALLBACK, EndReason.AUDIT_SUPPRESSED)
    if verdict is Verdict.ASK_USER:
        return End(TurnState.SUCCEEDED, EndReason.AUDIT_ASK_USER, audit.final_output or "")
    return End(TurnState.SUCCEEDED, EndReason.AUDIT_FAILED, text)


def _budget_refused(status: CallStatus) -> bool:
    return isinstance(status, FailedTerminal | FailedRetryable) and (
        status.error.code is ErrorCode.CALL_BUDGET_EXCEEDED
    )


CARD_HEADER = "Nothing has been done yet. Waiting for a person to approve:"
CARD_FOOTER = "Each runs only if it is approved, and at most once."


def card_answer(statuses: Sequence[CallStatus]) -> str:
    """A turn's answer when it ends with approval cards: written by the server, never
    by the model, so it cannot say a write was done. One line per call waiting for a
    person: the tool and the operation id, both the server's (not the call id, which
    the model wrote); what else the step did is in its calls."""
    lines = [CARD_HEADER]
    cards = [s for s in statuses if isinstance(s, Pending) and s.state == State.PENDING_APPROVAL.value]
    for number, status in enumerate(cards, start=1):
        lines.append(f"{number}. {status.tool_name} (operation {status.operation_id})")
    lines.append(CARD_FOOTER)
    return "\n".join(lines)
