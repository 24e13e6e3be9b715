"""Prometheus metrics counted by producers, relays, workers and the reconciler.

Names under `toolfence_`, base units, `_total` counters, bounded labels only
(tool, outcome, stage, gate, action, effect): never an operation id, principal or
hostname. Prefork workers write to `PROMETHEUS_MULTIPROC_DIR` (prometheus-client
multiprocess mode) and `toolfence metrics` aggregates them; the gauges computed
from the database live in `executor.telemetry.exporter`.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from executor.core.approvers import ApprovalDecision
from executor.store.records import Decision, DecisionOutcome

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

PROPOSALS = Counter(
    "toolfence_proposals_total",
    "Proposed tool calls by the admission gate that decided them.",
    ["tool", "gate", "decision"],
)
OPERATIONS_TERMINAL = Counter(
    "toolfence_operations_terminal_total",
    "Operations reaching a terminal or reconciliation_pending state.",
    ["tool", "outcome"],
)
HANDLER_INVOCATIONS = Counter(
    "toolfence_handler_invocations_total",
    "Times a tool handler (run) was invoked.",
    ["tool"],
)
SIDE_EFFECTS = Counter(
    "toolfence_side_effects_total",
    "Downstream side effects accepted (receipts) as seen by workers and the reconciler.",
    ["tool", "effect"],
)
STALE_WRITES_FENCED = Counter(
    "toolfence_stale_writes_fenced_total",
    "Writes from a stale generation that were refused.",
    ["stage"],  # downstream | renew | complete
)
LEASE_RENEWAL_STATEMENTS = Counter(
    "toolfence_lease_renewal_statements_total",
    "Lease renewal statements sent (one per worker process per tick, whatever it holds).",
)
LEASE_TAKEOVERS = Counter(
    "toolfence_lease_takeovers_total",
    "Operations whose expired lease was taken over by a new generation.",
    ["tool"],
)
EXECUTION_REFUSALS = Counter(
    "toolfence_execution_refusals_total",
    "Operations a re-check refused just before the handler ran (the handler never ran).",
    ["tool", "code"],  # permission_denied | approval_required | business_rule_violation | ...
)
APPROVAL_DECISIONS = Counter(
    "toolfence_approval_decisions_total",
    "Approval decisions attempted, by outcome.",
    ["tool", "decision"],  # approved | denied | approver_not_allowed | not_pending
)
RETRIES = Counter(
    "toolfence_retries_total",
    "Retryable failures released to retry_wait.",
    ["tool", "code"],
)
IDEMPOTENCY = Counter(
    "toolfence_idempotency_total",
    "Registrations that met an existing operation id, or a call id its request already recorded.",
    ["tool", "outcome"],  # reused | in_progress | conflict | re_enqueued
)
REPEATED_PROPOSALS = Counter(
    "toolfence_repeated_proposals_total",
    "Writes repeating an earlier one of their request or conversation, not run again.",
    ["tool", "outcome"],  # reused | failed (answered repeated_failed_call)
)
BUDGET_EXCEEDED = Counter(
    "toolfence_call_budget_exceeded_total",
    "Calls refused because their request or conversation used its budget.",
    ["tool", "scope", "budget"],  # scope: request | conversation; budget: max_calls, …
)
RECONCILER_ACTIONS = Counter(
    "toolfence_reconciler_actions_total",
    "What the reconciler did.",
    ["action"],
)
MESSAGES = Counter(
    "toolfence_worker_messages_total",
    "Messages taken from the broker by outcome (ran, not_ready, duplicate, bad_message, …).",
    ["outcome"],
)
RELAY_PUBLISHED = Counter(
    "toolfence_relay_published_total", "Outbox rows published to the broker.", []
)
RELAY_PUBLISH_FAILURES = Counter(
    "toolfence_relay_publish_failures_total",
    "Outbox rows whose publish failed (they back off and are tried again).",
    [],
)
EXECUTION_SECONDS = Histogram(
    "toolfence_execution_seconds",
    "Time spent in a tool handler.",
    ["tool"],
    buckets=LATENCY_BUCKETS,
)
ENQUEUE_TO_TERMINAL_SECONDS = Histogram(
    "toolfence_enqueue_to_terminal_seconds",
    "Time from admission to the terminal state, on the database clock.",
    ["tool"],
    buckets=LATENCY_BUCKETS,
)
SIDE_EFFECTS_PER_OPERATION = Histogram(
    "toolfence_side_effects_per_operation",
    "Distinct accepted side effects of an operation, observed at its terminal state.",
    ["tool"],
    buckets=(0, 1, 2, 3, 5),
)
APPROVAL_SCOPE_EXCEEDED = Counter(
    "toolfence_approval_scope_exceeded_total",
    "Writes whose handler reported changing resources outside their approved set "
    "(counted when seen, whoever then wins the operation's CAS: the effect happened).",
    ["tool"],
)

HOSTED_CALLS = Counter(
    "toolfence_hosted_calls_total",
    "Provider-run (hosted) calls read from responses, by whether the hosted-tool policy allowed them.",
    ["surface", "kind", "outcome"],  # outcome: allowed | not_allowed
)

TURNS_ENDED = Counter(
    "toolfence_turns_ended_total",
    "Turns that ended, by end state and reason.",
    ["state", "reason"],  # state: succeeded | failed | fallback; reason: EndReason
)
TURNS_REFUSED = Counter(
    "toolfence_turns_refused_total",
    "Turns refused at start (turn_in_progress: the user already has a running turn).",
    ["code"],
)
TURN_STEPS = Histogram(
    "toolfence_turn_steps",
    "Model steps a turn took, observed when it ends.",
    ["state"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32),
)
TURN_FALLBACKS = Counter(
    "toolfence_turn_fallbacks_total",
    "Turns that ended with the application's fallback output, or emitted a candidate "
    "after the audit failed, by reason.",
    ["reason"],
)
MODEL_CALLS = Counter(
    "toolfence_model_calls_total",
    "Model (driver) calls by purpose and outcome.",
    ["purpose", "outcome"],  # purpose: turn | audit; outcome: ok | contract_error | driver_error
)
MODEL_LATENCY_SECONDS = Histogram(
    "toolfence_model_latency_seconds",
    "Time a model (driver) call took, by purpose.",
    ["purpose"],
    buckets=LATENCY_BUCKETS,
)
MODEL_TOKENS = Counter(
    "toolfence_model_tokens_total",
    "Tokens the model read and wrote, by purpose and direction.",
    ["purpose", "direction"],  # direction: input | output
)
AUDIT_VERDICTS = Counter(
    "toolfence_audit_verdicts_total",
    "Audit hook verdicts: emit | suppress | deny_and_read | ask_user | failed.",
    ["verdict"],
)
TURN_MESSAGES = Counter(
    "toolfence_turn_messages_total",
    "Turn job messages taken from the broker, by what they did (succeeded, released, "
    "waiting_approval, duplicate, owned_elsewhere, lost_ownership, …).",
    ["outcome"],
)
TURN_RESUMES = Counter(
    "toolfence_turn_resumes_total",
    "Turn jobs that took over a turn from an earlier generation (its worker died or gave it back).",
    [],
)
# `toolfence serve`: route is the route's template (`/v1/requests/{request_id}`), or
# `unmatched`, so its values are bounded; status is the HTTP status code.
HTTP_RESPONSES = Counter(
    "toolfence_http_responses_total",
    "Responses of toolfence serve, by route template and status code.",
    ["route", "status"],
)
HTTP_SECONDS = Histogram(
    "toolfence_http_request_seconds",
    "Time to answer a request of toolfence serve (long-polls included), by route template.",
    ["route"],
    buckets=LATENCY_BUCKETS,
)


def count_approval_decision(decision: Decision, verb: ApprovalDecision) -> None:
    """Count what `store.approve`/`store.deny` did (every caller of them calls this)."""
    if decision.outcome is DecisionOutcome.DECIDED:
        label = "approved" if verb is ApprovalDecision.APPROVE else "denied"
    else:
        label = decision.outcome.value
    APPROVAL_DECISIONS.labels(decision.tool_name or "unknown", label).inc()
