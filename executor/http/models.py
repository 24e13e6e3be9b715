"""The API's request and response bodies (pydantic): what the OpenAPI document says.

Request bodies forbid unknown fields, and none of them has a field for who the
caller is: identity comes from the API key (a body naming `tenant`,
`principal`, `roles` or `scopes` is refused before it is validated).

Every response field a person reads (who asked, who decided, reasons, notes,
impact) is `Shown`/`ShownJson`: passed through the project's one sanitiser
(executor/core/sanitize.py) as the response is built, so a secret-shaped
principal or a control character in a reason never reaches a screen raw,
whatever wrote it (decision 0201). A turn's principal, answer and errors come
sanitised from `get_turn`, the one reader every surface uses (0202), and are not
scanned twice. Identifiers are not rewritten: a client sends them back.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)

from executor.core import types as core_types
from executor.core.sanitize import sanitize_json, shown_text
from executor.core.times import iso_utc

SHOWN_MAX_CHARS = 1_000
SHOWN_JSON_MAX_CHARS = 16_000


def _shown(text: str) -> str:
    return shown_text(text, SHOWN_MAX_CHARS)


def _shown_json(value: Any) -> Any:
    return sanitize_json(value, SHOWN_JSON_MAX_CHARS)


def _moment(value: Any) -> Any:
    """The store's epoch seconds as an aware UTC datetime (a datetime stays one)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    return value


def moment(epoch_seconds: float) -> datetime:
    """The store's epoch seconds as the aware UTC datetime a `Moment` field holds."""
    return datetime.fromtimestamp(epoch_seconds, UTC)


Moment = Annotated[
    datetime,
    BeforeValidator(_moment),
    PlainSerializer(lambda moment: iso_utc(moment.timestamp()), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time",
                    "description": "ISO 8601 in UTC, to the millisecond (2026-12-05T07:51:44.123Z)"}),
]
"""A time in the API's JSON: ISO 8601 UTC (executor/core/times.py), never epoch seconds.
A datetime in Python (the console's templates format it)."""

Shown = Annotated[str, AfterValidator(_shown)]
"""Text a person reads (a principal, a reason, a note), sanitised (`shown_text`,
with room for a reason)."""
ShownJson = Annotated[dict[str, Any], AfterValidator(_shown_json)]
"""A JSON object a person reads (an impact, an error), sanitised with its structure kept."""
ShownValue = Annotated[Any, AfterValidator(_shown_json)]
"""Any JSON value a person reads (a tool's output), sanitised with its structure kept."""

NAMED = "x-toolfence-named-schema"
"""A placeholder schema naming one of NAMED_SCHEMAS: the OpenAPI document replaces it
with a `$ref` to that component (`named_refs`). Pydantic checks the `$ref`s it writes
itself, so it cannot be given one to a schema it does not build."""

PROVIDER_NAMES = ("openai-chat", "openai-responses", "anthropic", "gemini", "gemini-interactions")
ProviderName = Annotated[
    Literal["openai-chat", "openai-responses", "anthropic", "gemini", "gemini-interactions"],
    # A component of its own (NAMED_SCHEMAS): a generated client's enum is ProviderName,
    # not GetRequestProviderType0.
    WithJsonSchema({NAMED: "ProviderName"}),
]
"""The provider surfaces (executor.providers.SURFACES; a unit test keeps them equal)."""

IDENTITY_FIELDS = frozenset({"tenant", "principal", "roles", "scopes"})

# What a turn runs on is the server's to decide: a `driver` (or its options) in a
# body is refused, not ignored (a scripted driver names a file the worker reads).
TURN_SERVER_FIELDS = frozenset({"driver", "options", "max_steps", "scope", "when_busy"})

MAX_CALLS = 256
MAX_WAIT_SECONDS = 30.0


# Ids and names: printable text (no control characters), as the database stores them.
ID_PATTERN = r"^[^\x00-\x1f\x7f]+$"
# What the document says of text: the strict reader (executor/http/body.py) refuses
# NUL in any string (the database cannot hold it), which each text field's pattern
# states. A lone surrogate (a `\ud800` escape) in a person's free text (`reason`,
# `note`, `message`: MENDED_TEXT_FIELDS) is replaced by U+FFFD, as a UTF-8 decoder
# does; anywhere else it is refused 400 `invalid_text`, which the descriptions say
# (a JSON Schema pattern cannot name surrogates portably: Rust and ECMA engines
# refuse the range) (decision 0201).
TEXT_DOC_PATTERN = r"^[^\u0000]*$"
MENDED_TEXT_FIELDS = frozenset({"reason", "note", "message"})
_ID_DOC: dict[str, Any] = {
    "description": "printable text (no control, format, private-use or unassigned character: "
    "400 not_printable); a lone surrogate is refused (400 invalid_text)"
}
_TEXT_DOC: dict[str, Any] = {
    "pattern": TEXT_DOC_PATTERN,
    "description": "free text without NUL; a lone surrogate is read as U+FFFD",
}
_FREE_FORM = (
    " Strings anywhere in it hold no NUL and no lone surrogate (400 invalid_text)."
)


CallArguments = Annotated[
    dict[str, Any],
    # A component of its own (NAMED_SCHEMAS): a generated client's model is
    # CallArguments, not NeutralCallArgumentsType1.
    WithJsonSchema({NAMED: "CallArguments"}),
]
"""A call's arguments as a JSON object (the other form is JSON text)."""
ProviderResult = Annotated[dict[str, Any], WithJsonSchema({NAMED: "ProviderResult"})]
"""One call's result in a provider's shape (`GET /v1/requests/{id}?provider=`)."""
TurnError = Annotated[dict[str, Any], WithJsonSchema({NAMED: "TurnError"})]
Impact = Annotated[dict[str, Any], WithJsonSchema({NAMED: "Impact"})]
"""What a call waiting for approval would do, as its tool's impact hook computed it."""
"""Why a turn or a step failed: `code`, `message` (sanitised)."""

NAMED_SCHEMAS: dict[str, dict[str, Any]] = {
    "ProviderName": {
        "title": "ProviderName", "type": "string", "enum": list(PROVIDER_NAMES),
        "description": "a provider surface (its request and result shapes)",
    },
    "CallArguments": {
        "title": "CallArguments", "type": "object", "additionalProperties": True,
        "description": "a call's arguments as a JSON object",
    },
    "ProviderResult": {
        "title": "ProviderResult", "type": "object", "additionalProperties": True,
        "description": "one call's result in the provider's own shape",
    },
    "Impact": {
        "title": "Impact", "type": "object", "additionalProperties": True,
        "description": "what a call waiting for approval would do, from its tool's impact hook",
    },
    "TurnError": {
        "title": "TurnError", "type": "object", "additionalProperties": True,
        "description": "why a turn or a step failed: code and message, sanitised",
    },
}
"""Schemas the models refer to by name (`$ref`), added to the OpenAPI document's
components (executor/http/api.py): what a generated client names its types after."""


def named_refs(schema: Any) -> Any:
    """`schema` with each NAMED placeholder replaced by a `$ref` to its component."""
    if isinstance(schema, dict):
        if NAMED in schema:
            return {"$ref": f"#/components/schemas/{schema[NAMED]}"}
        return {key: named_refs(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [named_refs(item) for item in schema]
    return schema


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NeutralCall(_Body):
    call_id: str = Field(min_length=1, max_length=200, pattern=ID_PATTERN, json_schema_extra=_ID_DOC)
    tool_name: str = Field(min_length=1, max_length=200, pattern=ID_PATTERN, json_schema_extra=_ID_DOC)
    arguments: str | CallArguments = Field(
        description="the arguments as the model wrote them: JSON text, or an object." + _FREE_FORM
    )


class NeutralBatch(_Body):
    """Calls in toolfence's neutral format."""

    calls: list[NeutralCall] = Field(
        min_length=1, max_length=MAX_CALLS,
        description="each call_id once in a batch (two alike: 400 duplicate_call_id)",
    )
    conversation_id: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=ID_PATTERN, json_schema_extra=_ID_DOC
    )


MAX_BATCH_REQUESTS = 100
MAX_BATCH_CALLS = 1000


class BatchedRequest(_Body):
    """One request of a request batch: calls in the neutral format, as `NeutralBatch`."""

    calls: list[NeutralCall] = Field(
        min_length=1, max_length=MAX_CALLS,
        description="each call_id once in a request (two alike: 400 duplicate_call_id)",
    )
    conversation_id: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=ID_PATTERN, json_schema_extra=_ID_DOC
    )
    request_key: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$",
        description="names the request, per key tenant and principal (as Idempotency-Key names a "
        "POST /v1/requests' request, in a namespace of its own): the same item sent again answers "
        "each call from what is recorded, a call id reused for a different call is "
        "`idempotency_conflict`. Without one, the request is new.",
    )


class RequestBatch(_Body):
    """Many requests admitted and enqueued in one transaction (`enqueue_many`)."""

    requests: list[BatchedRequest] = Field(
        min_length=1, max_length=MAX_BATCH_REQUESTS,
        description=f"at most {MAX_BATCH_CALLS} calls in all; each request_key once (two alike: "
        "400 duplicate_request)",
    )

    @model_validator(mode="after")
    def _bounded(self) -> RequestBatch:
        if sum(len(r.calls) for r in self.requests) > MAX_BATCH_CALLS:
            raise ValueError(f"at most {MAX_BATCH_CALLS} calls in one batch")
        return self


class ProviderEnvelope(_Body):
    """A provider's response, as its API returned it; `provider` names the surface."""

    provider: ProviderName
    response: dict[str, Any] = Field(
        description="the provider's response as its API returned it; what its adapter cannot "
        "read is refused (400, errors[].path /response)." + _FREE_FORM
    )
    conversation_id: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=ID_PATTERN, json_schema_extra=_ID_DOC
    )


IMPACT_DIGEST_PATTERN = r"^[0-9a-f]{32}$"


class DecisionBody(_Body):
    reason: str | None = Field(default=None, max_length=1000, json_schema_extra=_TEXT_DOC)
    impact_digest: str | None = Field(
        default=None, pattern=IMPACT_DIGEST_PATTERN,
        description="the `impact_digest` of the impact the approver was shown (GET /v1/approvals). "
        "When given, an approval whose impact has changed since (recomputed on current state) is "
        "refused 409 `impact_changed` and nothing is decided. When absent, the approval is decided "
        "on the impact as it is now, which the answer's `impact_digest` names (decision 0222).",
    )


TURN_MESSAGE_MAX_CHARS = 100_000


class TurnBody(_Body):
    """A user message to run as a turn. There is no `driver` field: the model a turn
    runs on is the server's setting (TOOLFENCE_TURN_DRIVER), never the caller's."""

    conversation_id: str = Field(
        min_length=1, max_length=200, pattern=ID_PATTERN, json_schema_extra=_ID_DOC
    )
    message: str = Field(min_length=1, max_length=TURN_MESSAGE_MAX_CHARS, json_schema_extra=_TEXT_DOC)


class ResolveBody(_Body):
    """How an operation waiting for a person ended. `succeeded` needs the downstream's
    `reference` (the schema says so with `if`/`then`; a body without one is 422)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"properties": {"outcome": {"const": "succeeded"}}, "required": ["outcome"]},
            "then": {"required": ["reference"], "properties": {"reference": {"type": "string"}}},
        },
    )

    outcome: Literal["succeeded", "failed", "requeue"]
    reference: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=ID_PATTERN,
        description="the downstream's id for the effect (needed for succeeded); a lone "
        "surrogate is refused (400 invalid_text)",
    )
    note: str | None = Field(default=None, max_length=1000, json_schema_extra=_TEXT_DOC)

    @model_validator(mode="after")
    def _succeeded_names_its_reference(self) -> ResolveBody:
        if self.outcome == "succeeded" and self.reference is None:
            raise ValueError("resolving as succeeded needs the downstream's reference")
        return self


class Succeeded(core_types.Succeeded):
    """A success as the API shows it: the library's `Succeeded`, its freshness times
    (`observed_at`, `source_time`) in ISO 8601 UTC instead of epoch seconds."""

    observed_at: Moment | None = None  # type: ignore[assignment]
    source_time: Moment | None = None  # type: ignore[assignment]


class Pending(core_types.Pending):
    """A call without a terminal outcome as the API shows it: the library's `Pending`,
    its impact a named schema (a generated client's `Impact`)."""

    impact: Impact | None = None


CallStatus = Annotated[
    Succeeded | core_types.FailedRetryable | core_types.FailedTerminal | Pending,
    Field(discriminator="status"),
]
"""One call's status as the API shows it (the library's `CallStatus`, times in ISO
8601 UTC). Build it from the library's with `call_statuses`."""


def call_statuses(statuses: Sequence[core_types.CallStatus]) -> list[dict[str, Any]]:
    """The library's statuses as the API's CallStatus reads them (epoch seconds
    become UTC times when validated)."""
    return [status.model_dump() for status in statuses]


class RequestAnswer(BaseModel):
    """One status per call, in proposal order: rejected calls' terminal results,
    admitted calls' operation ids and states."""

    request_id: str
    calls: list[CallStatus]
    settled: bool
    provider: ProviderName | None = None
    results: list[ProviderResult] | None = Field(
        default=None, description="with ?provider=: the results in that provider's shape"
    )


class BatchAnswer(BaseModel):
    """One answer per request of the batch, in order, each as POST /v1/requests answers."""

    requests: list[RequestAnswer]


class AmountOut(BaseModel):
    """A tool's display hint for an integer of its impact: minor units of `currency`."""

    currency: str
    decimals: int


class RelatedOut(BaseModel):
    """Another pending or in-flight operation of the tenant on one of the card's resources."""

    operation_id: str
    tool: str
    state: str
    shared: list[str] = Field(description="the resources it shares with the card")


class ApprovalOut(BaseModel):
    approval_id: str
    kind: Literal["operation", "hosted"]
    operation_id: str | None
    request_id: str
    call_id: str | None
    tool: str
    requester: Shown
    impact: Annotated[ShownJson, WithJsonSchema({NAMED: "Impact"})] = Field(
        description="recomputed on current state when this answer was made (the tool's impact "
        "hook); the stored one when it could not be (then `impact_current` is false)"
    )
    impact_digest: str | None = Field(
        description="send it with the approval: a changed impact is refused `impact_changed`; "
        "null when the impact could not be recomputed (the approval cannot be approved now)"
    )
    impact_as_of: Moment = Field(description="when the impact was computed (ISO 8601 UTC)")
    impact_current: bool
    amounts: dict[str, AmountOut] = Field(description="the tool's display hints for the impact's amounts")
    related: list[RelatedOut] = Field(
        description="the tenant's other pending and in-flight operations on the same resources, "
        "newest first, at most 10"
    )
    related_count: int = Field(description="how many such operations there are")
    resources: list[str] | None
    intent_hash: str
    requested_at: Moment
    expires_at: Moment
    age_seconds: float


class ApprovalList(BaseModel):
    approvals: list[ApprovalOut]


class DecisionOut(BaseModel):
    approval_id: str
    decision: Literal["approved", "denied"]
    decided_by: Shown
    operation_id: str | None
    state: str | None
    impact_digest: str | None = Field(
        default=None, description="the digest of the impact an approval was decided on"
    )


class ReceiptOut(BaseModel):
    receipt: Shown
    generation: int
    accepted: bool
    source: Shown


class PendingOut(BaseModel):
    operation_id: str
    request_id: str
    call_id: str
    tool: str
    generation: int
    since: Moment
    reason: Shown | None
    cause: str | None
    receipts: list[ReceiptOut]
    age_seconds: float = Field(default=0.0, description="how long it has waited for a person")
    arguments: Annotated[ShownJson, WithJsonSchema({NAMED: "CallArguments"})] | None = Field(
        default=None, description="the call's arguments, redacted"
    )
    effects: list[str] = Field(
        default_factory=list,
        description="the tool's declared effects; `unsafe`: running it again may do it twice",
    )


class PendingList(BaseModel):
    operations: list[PendingOut]


class AuditEventOut(BaseModel):
    at: Moment
    from_state: str | None
    to_state: str
    decision: str
    generation: int
    actor: Shown | None


class RequestCallOut(BaseModel):
    call_id: str
    tool_name: str
    operation_id: str | None
    gate: str | None
    state: str | None = Field(default=None, description="its operation's state (null: refused at admission)")
    error_code: str | None = None


class ApprovalDecisionOut(BaseModel):
    """How the operation's approval ended: who decided, when, and why."""

    state: Literal["pending", "approved", "denied", "expired"]
    decided_by: Shown | None
    decided_at: float | None
    reason: Shown | None


class OperationOut(BaseModel):
    operation_id: str
    request_id: str
    call_id: str
    tool: str
    state: str
    generation: int
    attempts: int
    error_code: str | None
    cause: str | None
    receipt: Shown | None
    receipts: list[ReceiptOut]
    side_effects: int = Field(description="distinct accepted receipts (I1: at most one)")
    audit: list[AuditEventOut]
    request_calls: list[RequestCallOut]
    arguments: Annotated[ShownJson, WithJsonSchema({NAMED: "CallArguments"})] | None = Field(
        default=None, description="the call's arguments, redacted"
    )
    output: ShownValue = Field(default=None, description="what the tool returned, redacted")
    error_message: Shown | None = None
    approval: ApprovalDecisionOut | None = Field(
        default=None, description="the approval it waited for, if any: the decision and its reason"
    )


class ResolveOut(BaseModel):
    operation_id: str
    state: str
    resolved_by: Shown


class TurnStarted(BaseModel):
    """The answer to POST /v1/turns: the turn is written; a worker runs it."""

    turn_id: str
    state: Literal["running", "queued"]


class TurnUsageOut(BaseModel):
    model: str
    purpose: str
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    latency_seconds: float


class TurnCallOut(BaseModel):
    call_id: str
    tool_name: str


class TurnStepOut(BaseModel):
    step: int
    outcome: Literal["tool_calls", "final", "nothing", "contract_error", "audit"]
    verdict: str | None
    usage: TurnUsageOut
    final_output: str | None = Field(description="sanitised where it is stored and read (get_turn)")
    error: TurnError | None = Field(description="sanitised where it is read (get_turn)")
    proposed: list[TurnCallOut] = Field(description="the calls the model proposed in this step")
    calls: list[CallStatus] = Field(description="each proposed call's status and result")
    listed: list[str] | None = Field(
        description="the ids of the items the turn's surface listed to the model at this step "
        "(a tool's listed argument may name only these); null when none were listed",
    )


class TurnOut(BaseModel):
    """A turn: its state, each checkpointed step with its calls' results, and the end.
    Never the prompts or the model's raw responses."""

    turn_id: str
    conversation_id: str
    principal: str = Field(description="sanitised where it is read (get_turn)")
    state: Literal["queued", "running", "waiting_approval", "succeeded", "failed", "fallback"]
    terminal: bool
    end_reason: str | None
    final_output: str | None = Field(description="sanitised where it is stored and read (get_turn)")
    error: TurnError | None = Field(description="sanitised where it is read (get_turn)")
    surface: str | None = Field(
        description="the turn surface the turn runs under (the key's, else the server's "
        "TOOLFENCE_TURN_SURFACE); null: none",
    )
    generation: int
    steps: list[TurnStepOut]
    created_at: Moment
    finished_at: Moment | None


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready"]
    revision: str
