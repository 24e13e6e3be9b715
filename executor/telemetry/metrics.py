"""Prometheus metrics counted by producers, relays, workers and the reconciler.

Names under `toolfence_`, base units, `_total` counters, closed labels only
(tool, outcome, stage, gate, action, effect): never an operation id, principal or
hostname. Every label of every metric here takes its values from a closed set
(`Domain`); a value outside it is counted as `other`, so no envelope, model or
caller can mint series (decision 0195: one hostile POST once made 304). Prefork
workers write to `PROMETHEUS_MULTIPROC_DIR` (prometheus-client multiprocess
mode) and `toolfence metrics` aggregates them; the gauges computed from the
database live in `executor.telemetry.exporter`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client import Counter, Histogram

from executor.core.admission import Gate
from executor.core.approvers import ApprovalDecision
from executor.core.budgets import Budget, Scope
from executor.core.states import State, TurnState
from executor.core.tools import Effect, is_declared_tool_name
from executor.core.types import ErrorCode
from executor.store.approvals import HOSTED_APPROVAL_TOOL
from executor.store.invariant_check import INVARIANTS
from executor.store.records import Decision, DecisionOutcome

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

OTHER = "other"
"""The label value of everything outside a label's closed set."""


@dataclass(frozen=True)
class Domain:
    """The closed set one label's values come from.

    `values` is fixed; `declared`, when given, answers for values the process
    declares at run time and nobody else can add (the names of the tools its
    registries hold, the routes of its HTTP app). Anything else is `other`.
    """

    values: frozenset[str]
    declared: Callable[[str], bool] | None = None

    def admit(self, value: object) -> str:
        text = str(value)  # a StrEnum member's str is its value
        if text in self.values or (self.declared is not None and self.declared(text)):
            return text
        return OTHER


def _domain(*values: Iterable[str]) -> Domain:
    return Domain(frozenset(itertools.chain.from_iterable(values)))


def _effect_sets() -> frozenset[str]:
    """Every `",".join(sorted(tool.effects))` a tool can have."""
    effects = sorted(effect.value for effect in Effect)
    return frozenset(
        ",".join(combination)
        for size in range(len(effects) + 1)
        for combination in itertools.combinations(effects, size)
    )


TOOL = Domain(frozenset({"unknown", HOSTED_APPROVAL_TOOL}), declared=is_declared_tool_name)
"""A registered tool's name; `unknown` where a call named none (producer, approvals);
`hosted.mcp_approval_request` for a hosted approval's decisions."""
ERROR_CODE = _domain(code.value for code in ErrorCode)
OPERATION_STATE = _domain(state.value for state in State)
TURN_STATE = _domain(state.value for state in TurnState)
# The worker's message outcomes (executor.worker.outcomes.OutcomeLabel; tests check).
MESSAGE_OUTCOME = _domain({
    "bad_message", "unknown_operation", "duplicate", "not_due", "predecessor_failed",
    "owned_elsewhere", "not_ready", "succeeded", "failed_terminal", "retry_wait",
    "reconciliation_pending", "stale_complete", "fenced_downstream", "lost_ownership",
})
# What a turn message did (executor.worker.turns.TurnOutcome labels; tests read
# them from its source), and a turn's end state.
TURN_MESSAGE_OUTCOME = _domain(
    {"bad_message", "unknown_turn", "duplicate", "owned_elsewhere", "lost_ownership",
     "released", "waiting_approval"},
    TURN_STATE.values,
)
# executor.turns.values.EndReason (tests check).
END_REASON = _domain({
    "final", "nothing_more", "max_steps", "call_budget_exceeded", "contract_error",
    "driver_failed", "audit_suppressed", "audit_ask_user", "audit_failed",
    "response_refused", "hosted_call_not_allowed", "hosted_approval_required", "approval_card",
    "unknown_surface",
})
# The reconciler's actions (reconciler/sweep.py; tests read them from its source).
RECONCILER_ACTION = _domain({
    "requeued_stale", "marked_pending", "lookup_succeeded", "lookup_requeued",
    "promoted_retry", "republished_queued", "approval_expired", "hosted_approval_expired",
    "turn_requeued_stale", "turn_republished", "turn_resumed", "turn_promoted",
})
SURFACE = _domain({"openai-chat", "openai-responses", "anthropic", "gemini", "gemini-interactions"})
# The kinds of provider-run calls the adapters read (tests walk the SDKs' types):
# an unknown item's kind is provider-written text, and counts as `other`.
HOSTED_KIND = _domain({
    # OpenAI Responses
    "mcp_call", "mcp_list_tools", "mcp_approval_request", "web_search_call", "file_search_call",
    "code_interpreter_call", "image_generation_call", "tool_search_call", "program",
    # Anthropic Messages
    "server_tool_use", "mcp_tool_use", "mcp_tool_listing",
    # Gemini GenerateContent
    "executable_code", "tool_call",
    # Gemini Interactions: `<tool>_call` steps
    "code_execution_call", "google_search_call", "url_context_call", "google_maps_call",
    "mcp_server_tool_call", "retrieval_call", "processing_call",
})
HTTP_STATUS = _domain(str(status) for status in range(100, 600))
# The exporter's `toolfence_invariant_violations{invariant}`: I1–I7 (docs/design.md §Invariants).
INVARIANT = _domain(INVARIANTS)


class _Closed:
    """Maps every label value through its label's `Domain` before the metric sees it."""

    domains: Mapping[str, Domain] = MappingProxyType({})

    def closed_values(
        self, labelnames: Iterable[str], values: tuple[object, ...], named: Mapping[str, object]
    ) -> tuple[str, ...]:
        """The label values, positional or named (not both, all of them, as
        prometheus_client asks), each through its `Domain`."""
        names = tuple(labelnames)
        if named and values:
            raise ValueError("can't pass both *args and **kwargs")
        if named:
            if set(named) != set(names):
                raise ValueError("incorrect label names")
            values = tuple(named[name] for name in names)
        if len(values) != len(names):
            raise ValueError("incorrect label count")
        return tuple(self.domains[name].admit(value) for name, value in zip(names, values, strict=True))


class ClosedCounter(_Closed, Counter):
    def labels(self, *labelvalues: object, **labelkwargs: object) -> ClosedCounter:
        return super().labels(*self.closed_values(self._labelnames, labelvalues, labelkwargs))


class ClosedHistogram(_Closed, Histogram):
    def labels(self, *labelvalues: object, **labelkwargs: object) -> ClosedHistogram:
        return super().labels(*self.closed_values(self._labelnames, labelvalues, labelkwargs))


def _counter(name: str, documentation: str, **domains: Domain) -> ClosedCounter:
    metric = ClosedCounter(name, documentation, list(domains))
    metric.domains = MappingProxyType(domains)
    return metric


def _histogram(
    name: str, documentation: str, *, buckets: tuple[float, ...], **domains: Domain
) -> ClosedHistogram:
    metric = ClosedHistogram(name, documentation, list(domains), buckets=buckets)
    metric.domains = MappingProxyType(domains)
    return metric


PROPOSALS = _counter(
    "toolfence_proposals_total",
    "Proposed tool calls by the admission gate that decided them.",
    tool=TOOL,
    gate=_domain(gate.value for gate in Gate),
    decision=_domain({
        "admitted", "pending_approval", "rejected", "unavailable", "reused", "in_progress", "conflict",
    }),
)
OPERATIONS_TERMINAL = _counter(
    "toolfence_operations_terminal_total",
    "Operations reaching a terminal or reconciliation_pending state.",
    tool=TOOL, outcome=OPERATION_STATE,
)
HANDLER_INVOCATIONS = _counter(
    "toolfence_handler_invocations_total",
    "Times a tool handler (run) was invoked.",
    tool=TOOL,
)
SIDE_EFFECTS = _counter(
    "toolfence_side_effects_total",
    "Downstream side effects accepted (receipts) as seen by workers and the reconciler.",
    tool=TOOL, effect=Domain(_effect_sets()),
)
STALE_WRITES_FENCED = _counter(
    "toolfence_stale_writes_fenced_total",
    "Writes from a stale generation that were refused.",
    stage=_domain({"downstream", "renew", "complete"}),
)
LEASE_RENEWAL_STATEMENTS = _counter(
    "toolfence_lease_renewal_statements_total",
    "Lease renewal statements sent (one per worker process per tick, whatever it holds).",
)
LEASE_TAKEOVERS = _counter(
    "toolfence_lease_takeovers_total",
    "Operations whose expired lease was taken over by a new generation.",
    tool=TOOL,
)
EXECUTION_REFUSALS = _counter(
    "toolfence_execution_refusals_total",
    "Operations a re-check refused just before the handler ran (the handler never ran).",
    tool=TOOL, code=ERROR_CODE,  # permission_denied | approval_required | business_rule_violation | ...
)
APPROVAL_DECISIONS = _counter(
    "toolfence_approval_decisions_total",
    "Approval decisions attempted, by outcome.",
    tool=TOOL,
    decision=_domain({"approved", "denied"}, (outcome.value for outcome in DecisionOutcome)),
)
RETRIES = _counter(
    "toolfence_retries_total",
    "Retryable failures released to retry_wait.",
    tool=TOOL, code=ERROR_CODE,
)
IDEMPOTENCY = _counter(
    "toolfence_idempotency_total",
    "Registrations that met an existing operation id, or a call id its request already recorded.",
    tool=TOOL, outcome=_domain({"reused", "in_progress", "conflict", "re_enqueued"}),
)
REPEATED_PROPOSALS = _counter(
    "toolfence_repeated_proposals_total",
    "Writes repeating an earlier one of their request or conversation, not run again.",
    tool=TOOL, outcome=_domain({"reused", "failed"}),  # failed: answered repeated_failed_call
)
BUDGET_EXCEEDED = _counter(
    "toolfence_call_budget_exceeded_total",
    "Calls refused because their request or conversation used its budget.",
    tool=TOOL,
    scope=_domain(scope.value for scope in Scope),
    budget=_domain(budget.value for budget in Budget),
)
RECONCILER_ACTIONS = _counter(
    "toolfence_reconciler_actions_total",
    "What the reconciler did.",
    action=RECONCILER_ACTION,
)
MESSAGES = _counter(
    "toolfence_worker_messages_total",
    "Messages taken from the broker by outcome (ran, not_ready, duplicate, bad_message, …).",
    outcome=MESSAGE_OUTCOME,
)
RELAY_PUBLISHED = _counter("toolfence_relay_published_total", "Outbox rows published to the broker.")
RELAY_PUBLISH_FAILURES = _counter(
    "toolfence_relay_publish_failures_total",
    "Outbox rows whose publish failed (they back off and are tried again).",
)
RELAY_PUBLISH_SECONDS = _histogram(
    "toolfence_relay_publish_seconds",
    "Time one broker publish of the relay took (failed ones included): the broker's share of "
    "the outbox lag.",
    buckets=LATENCY_BUCKETS,
)
EXECUTION_SECONDS = _histogram(
    "toolfence_execution_seconds",
    "Time spent in a tool handler.",
    buckets=LATENCY_BUCKETS, tool=TOOL,
)
ENQUEUE_TO_TERMINAL_SECONDS = _histogram(
    "toolfence_enqueue_to_terminal_seconds",
    "Time from admission to the terminal state, on the database clock.",
    buckets=LATENCY_BUCKETS, tool=TOOL,
)
SIDE_EFFECTS_PER_OPERATION = _histogram(
    "toolfence_side_effects_per_operation",
    "Distinct accepted side effects of an operation, observed at its terminal state.",
    buckets=(0, 1, 2, 3, 5), tool=TOOL,
)
APPROVAL_SCOPE_EXCEEDED = _counter(
    "toolfence_approval_scope_exceeded_total",
    "Writes whose handler reported changing resources outside their approved set "
    "(counted when seen, whoever then wins the operation's CAS: the effect happened).",
    tool=TOOL,
)

HOSTED_CALLS = _counter(
    "toolfence_hosted_calls_total",
    "Provider-run (hosted) calls read from responses, by whether the hosted-tool policy allowed them.",
    surface=SURFACE, kind=HOSTED_KIND, outcome=_domain({"allowed", "not_allowed"}),
)

TURNS_ENDED = _counter(
    "toolfence_turns_ended_total",
    "Turns that ended, by end state and reason.",
    state=TURN_STATE, reason=END_REASON,
)
TURNS_REFUSED = _counter(
    "toolfence_turns_refused_total",
    "Turns refused at start (turn_in_progress: the user already has a running turn).",
    code=ERROR_CODE,
)
TURN_STEPS = _histogram(
    "toolfence_turn_steps",
    "Model steps a turn took, observed when it ends.",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32), state=TURN_STATE,
)
TURN_FALLBACKS = _counter(
    "toolfence_turn_fallbacks_total",
    "Turns that ended with the application's fallback output, or emitted a candidate "
    "after the audit failed, by reason.",
    reason=END_REASON,
)
MODEL_PURPOSE = _domain({"turn", "audit"})
MODEL_CALLS = _counter(
    "toolfence_model_calls_total",
    "Model (driver) calls by purpose and outcome.",
    purpose=MODEL_PURPOSE,
    outcome=_domain({"ok", "contract_error", "driver_error", "timeout"}),
)
MODEL_LATENCY_SECONDS = _histogram(
    "toolfence_model_latency_seconds",
    "Time a model (driver) call took, by purpose.",
    buckets=LATENCY_BUCKETS, purpose=MODEL_PURPOSE,
)
MODEL_TOKENS = _counter(
    "toolfence_model_tokens_total",
    "Tokens the model read and wrote, by purpose and direction.",
    purpose=MODEL_PURPOSE, direction=_domain({"input", "output"}),
)
AUDIT_VERDICTS = _counter(
    "toolfence_audit_verdicts_total",
    "Audit hook verdicts: emit | suppress | deny_and_read | ask_user | failed.",
    verdict=_domain({"emit", "suppress", "deny_and_read", "ask_user", "failed"}),
)
TURN_MESSAGES = _counter(
    "toolfence_turn_messages_total",
    "Turn job messages taken from the broker, by what they did (succeeded, released, "
    "waiting_approval, duplicate, owned_elsewhere, lost_ownership, …).",
    outcome=TURN_MESSAGE_OUTCOME,
)
TURN_RESUMES = _counter(
    "toolfence_turn_resumes_total",
    "Turn jobs that took over a turn from an earlier generation (its worker died or gave it back).",
)
# `toolfence serve`: route is the template of the route object the router matched
# (`/v1/requests/{request_id}`, declared by executor/http/observe.py, never the
# request's path), or `unmatched`; status the HTTP status code.
_ROUTES: set[str] = set()


def declare_routes(templates: Iterable[str]) -> None:
    """The route templates of a `toolfence serve` app: the only route label values."""
    _ROUTES.update(templates)


HTTP_ROUTE = Domain(frozenset({"unmatched"}), declared=_ROUTES.__contains__)
HTTP_RESPONSES = _counter(
    "toolfence_http_responses_total",
    "Responses of toolfence serve, by route template and status code.",
    route=HTTP_ROUTE, status=HTTP_STATUS,
)
HTTP_SECONDS = _histogram(
    "toolfence_http_request_seconds",
    "Time to answer a request of toolfence serve (long-polls included), by route template.",
    buckets=LATENCY_BUCKETS, route=HTTP_ROUTE,
)

ALL: tuple[ClosedCounter | ClosedHistogram, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, ClosedCounter | ClosedHistogram)
)
"""Every metric of this module (tests enumerate their label domains)."""


def count_approval_decision(decision: Decision, verb: ApprovalDecision) -> None:
    """Count what `store.approve`/`store.deny` did (every caller of them calls this)."""
    if decision.outcome is DecisionOutcome.DECIDED:
        label = "approved" if verb is ApprovalDecision.APPROVE else "denied"
    else:
        label = decision.outcome.value
    APPROVAL_DECISIONS.labels(decision.tool_name or "unknown", label).inc()
