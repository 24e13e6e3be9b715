"""Tables (SQLAlchemy Core): what the store's statements read and write.

Timestamps are epoch seconds in double precision, read from the *database's*
clock (`executor.store.clock.db_now()`), never the worker's. The same code runs
on PostgreSQL and SQLite; the schema itself is created by the alembic migrations
in `executor/store/migrations` (this module only describes it for queries).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

from executor.core.states import ACTIVE, TERMINAL, ApprovalState, State

metadata = MetaData()

Id = BigInteger().with_variant(Integer, "sqlite")

# State names as stored, in the enum's order (the partial index's WHERE term and the
# exporter's labels are written from these).
ACTIVE_STATES = tuple(s.value for s in State if s in ACTIVE)
TERMINAL_STATES = tuple(s.value for s in State if s in TERMINAL)

operations = Table(
    "toolfence_operations",
    metadata,
    Column("operation_id", String(200), primary_key=True),
    # Request ids are scoped by tenant (migration 0004; older rows from their context).
    Column("tenant", String(200), nullable=False, server_default=""),
    Column("request_id", String(200), nullable=False),
    Column("conversation_id", String(200)),
    Column("call_id", String(200), nullable=False),
    Column("position", Integer, nullable=False),
    Column("tool_name", String(200), nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("mode", String(8), nullable=False),
    Column("state", String(32), nullable=False),
    Column("generation", Integer, nullable=False, server_default="0"),
    Column("owner_token", String(64)),
    Column("lease_expires_at", Float),
    Column("intent_hash", String(64), nullable=False),
    Column("arguments", Text, nullable=False),
    Column("context", Text, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("available_at", Float, nullable=False),
    Column("queued_at", Float),
    Column("result", Text),
    Column("receipt", String(200)),
    Column("error_code", String(64)),
    Column("error", Text),
    Column("impact", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    # JSON list: the resource ids a write declaring `resources` was admitted (and
    # approved) for; NULL for every other operation (migration 0003).
    Column("approved_resources", Text),
    # JSON: the W3C trace context of the request span that registered it and of the
    # last execution attempt's span (executor/telemetry/tracing.py); NULL when
    # tracing was off (migration 0011).
    Column("trace_context", Text),
)

# The reconciler's query for stale `started` operations and the gauges read only
# the small active part of the table through these partial indexes.
Index(
    "ix_toolfence_operations_stale_started",
    operations.c.lease_expires_at,
    postgresql_where=operations.c.state == State.STARTED.value,
    sqlite_where=operations.c.state == State.STARTED.value,
)
Index(
    "ix_toolfence_operations_queued",
    operations.c.queued_at,
    postgresql_where=operations.c.state == State.QUEUED.value,
    sqlite_where=operations.c.state == State.QUEUED.value,
)
Index(
    "ix_toolfence_operations_retry_wait",
    operations.c.available_at,
    postgresql_where=operations.c.state == State.RETRY_WAIT.value,
    sqlite_where=operations.c.state == State.RETRY_WAIT.value,
)
Index(
    "ix_toolfence_operations_active",
    operations.c.state,
    operations.c.updated_at,
    postgresql_where=operations.c.state.in_(ACTIVE_STATES),
    sqlite_where=operations.c.state.in_(ACTIVE_STATES),
)
Index(
    "ix_toolfence_operations_request",
    operations.c.tenant,
    operations.c.request_id,
    operations.c.position,
)
# A write repeating an earlier one of its conversation is found through this index.
Index(
    "ix_toolfence_operations_conversation_intent",
    operations.c.tenant,
    operations.c.conversation_id,
    operations.c.intent_hash,
    postgresql_where=operations.c.conversation_id.is_not(None),
    sqlite_where=operations.c.conversation_id.is_not(None),
)

# One row per proposed call, keyed by (tenant, request id, call id). `proposal_hash`
# tells a re-enqueue of the same call from a conflict; `reused_from_call_id` marks a
# repeated write answered from an earlier call's operation (`operation_id` is that one).
calls = Table(
    "toolfence_calls",
    metadata,
    Column("tenant", String(200), primary_key=True, server_default=""),
    Column("request_id", String(200), primary_key=True),
    Column("call_id", String(200), primary_key=True),
    Column("conversation_id", String(200)),
    Column("position", Integer, nullable=False),
    Column("tool_name", String(200), nullable=False),
    Column("operation_id", String(200)),
    Column("gate", String(32)),
    Column("result", Text),
    Column("proposal_hash", String(64)),
    Column("reused_from_call_id", String(200)),
    Column("created_at", Float, nullable=False),
)
Index("ix_toolfence_calls_operation", calls.c.operation_id)
# Budgets count a conversation's calls through this index.
Index(
    "ix_toolfence_calls_conversation",
    calls.c.tenant,
    calls.c.conversation_id,
    calls.c.tool_name,
    postgresql_where=calls.c.conversation_id.is_not(None),
    sqlite_where=calls.c.conversation_id.is_not(None),
)
# The exporter checks I6 only on calls admitted within a recent window (migration
# 0002): a range scan on this index, so its cost follows throughput, not history.
Index("ix_toolfence_calls_created", calls.c.created_at)

outbox = Table(
    "toolfence_outbox",
    metadata,
    Column("outbox_id", Id, primary_key=True, autoincrement=True),
    Column("operation_id", String(200), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("published_at", Float),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", Float, nullable=False),
    Column("last_error", Text),
    # What the row asks the relay to publish (migration 0007): NULL an operation,
    # `turn` a turn job (`operation_id` then holds the turn id).
    Column("kind", String(16)),
)
Index(
    "ix_toolfence_outbox_unpublished",
    outbox.c.next_attempt_at,
    outbox.c.outbox_id,
    postgresql_where=outbox.c.published_at.is_(None),
    sqlite_where=outbox.c.published_at.is_(None),
)

# One append-only row per provider-run (hosted) call read from a response (migration
# 0005): what ran, whether the hosted-tool policy allowed it (NULL for an item that
# only reports a run), and for one it did not, `call_id`, the call row of the
# request answering it `hosted_call_not_allowed`. Never arguments or output text.
hosted_calls = Table(
    "toolfence_hosted_calls",
    metadata,
    Column("hosted_call_row_id", Id, primary_key=True, autoincrement=True),
    Column("tenant", String(200), nullable=False),
    Column("request_id", String(200), nullable=False),
    Column("hosted_call_id", String(200), nullable=False),
    Column("surface", String(32), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("server_label", String(200)),
    Column("tool_name", String(200)),
    Column("item_id", String(200)),
    Column("status", String(32)),
    Column("output_digest", String(64)),
    Column("allowed", Boolean),
    Column("code", String(64)),
    Column("call_id", String(200)),
    Column("recorded_at", Float, nullable=False),
)
Index(
    "ux_toolfence_hosted_calls_key",
    hosted_calls.c.tenant,
    hosted_calls.c.request_id,
    hosted_calls.c.hosted_call_id,
    unique=True,
)
Index("ix_toolfence_hosted_calls_recorded", hosted_calls.c.recorded_at)

audit_events = Table(
    "toolfence_audit_events",
    metadata,
    Column("event_id", Id, primary_key=True, autoincrement=True),
    Column("operation_id", String(200), nullable=False),
    Column("call_id", String(200)),
    Column("tool_name", String(200)),
    Column("schema_version", Integer),
    Column("from_state", String(32)),
    Column("to_state", String(32), nullable=False),
    Column("decision_code", String(64), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("intent_hash", String(64)),
    Column("actor", String(200)),
    Column("at", Float, nullable=False),
    Column("duration_ms", Float),
)
Index("ix_toolfence_audit_operation", audit_events.c.operation_id, audit_events.c.event_id)

receipts = Table(
    "toolfence_receipts",
    metadata,
    Column("receipt_row_id", Id, primary_key=True, autoincrement=True),
    Column("operation_id", String(200), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("receipt", String(200), nullable=False),
    Column("accepted", Boolean, nullable=False),
    Column("source", String(32), nullable=False),
    Column("recorded_at", Float, nullable=False),
)
Index("ix_toolfence_receipts_operation", receipts.c.operation_id)
# The exporter's I1 check starts from accepted receipts recorded within a recent
# window (migration 0002); the predicate is spelt per dialect because SQLite only
# uses a partial index whose WHERE term matches the query's text (`accepted = 1`).
Index(
    "ix_toolfence_receipts_accepted_recorded",
    receipts.c.recorded_at,
    receipts.c.operation_id,
    postgresql_where=receipts.c.accepted,
    sqlite_where=receipts.c.accepted == 1,
)

approvals = Table(
    "toolfence_approvals",
    metadata,
    Column("approval_id", String(64), primary_key=True),
    Column("operation_id", String(200), nullable=False, unique=True),
    Column("intent_hash", String(64), nullable=False),
    Column("impact", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("requested_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("decided_at", Float),
    Column("decided_by", String(200)),
    Column("reason", Text),
)
Index(
    "ix_toolfence_approvals_pending",
    approvals.c.requested_at,
    postgresql_where=approvals.c.state == ApprovalState.PENDING.value,
    sqlite_where=approvals.c.state == ApprovalState.PENDING.value,
)

# One row per `mcp_approval_request` a provider asked, within the hosted-tool policy
# (migration 0006): toolfence's own approval of a hosted MCP call, bound to
# `intent_hash` (tenant, server label, tool, canonical arguments). The provider's
# arguments are never stored: `impact` is their redacted summary, what the approver
# is shown. Decided once, by a CAS on `pending`, like `toolfence_approvals`.
hosted_approvals = Table(
    "toolfence_hosted_approvals",
    metadata,
    Column("approval_id", String(64), primary_key=True),
    Column("tenant", String(200), nullable=False),
    Column("request_id", String(200), nullable=False),
    Column("approval_request_id", String(200), nullable=False),
    Column("surface", String(32), nullable=False),
    Column("server_label", String(200), nullable=False),
    Column("tool_name", String(200), nullable=False),
    Column("intent_hash", String(64), nullable=False),
    Column("impact", Text, nullable=False),
    Column("context", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("requested_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("decided_at", Float),
    Column("decided_by", String(200)),
    Column("reason", Text),
)
Index(
    "ux_toolfence_hosted_approvals_request",
    hosted_approvals.c.tenant,
    hosted_approvals.c.approval_request_id,
    unique=True,
)
Index(
    "ix_toolfence_hosted_approvals_pending",
    hosted_approvals.c.expires_at,
    postgresql_where=hosted_approvals.c.state == ApprovalState.PENDING.value,
    sqlite_where=hosted_approvals.c.state == ApprovalState.PENDING.value,
)

# The audit trail of hosted approvals (append-only): `toolfence_audit_events` is
# keyed by an operation, and a hosted approval has none.
hosted_approval_events = Table(
    "toolfence_hosted_approval_events",
    metadata,
    Column("event_id", Id, primary_key=True, autoincrement=True),
    Column("approval_id", String(64), nullable=False),
    Column("from_state", String(16)),
    Column("to_state", String(16), nullable=False),
    Column("decision_code", String(64), nullable=False),
    Column("actor", String(200)),
    Column("at", Float, nullable=False),
)
Index(
    "ix_toolfence_hosted_approval_events_approval",
    hosted_approval_events.c.approval_id,
    hosted_approval_events.c.event_id,
)

# Durable turns (migration 0007). A turn is one user message run as a job; its
# steps are checkpointed in `turn_steps` before their calls are enqueued. At most
# one `running` turn per (tenant, scope_key) (the principal or the conversation,
# by setting), owned by the partial unique index, never by a Python check.
TURN_RUNNING = "running"
TURN_WAITING_APPROVAL = "waiting_approval"

turns = Table(
    "toolfence_turns",
    metadata,
    Column("turn_id", String(64), primary_key=True),
    Column("tenant", String(200), nullable=False),
    Column("principal", String(200), nullable=False),
    Column("conversation_id", String(200), nullable=False),
    Column("scope_key", String(420), nullable=False),
    Column("context", Text, nullable=False),
    Column("message", Text, nullable=False),
    Column("driver", String(1000), nullable=False),
    Column("options", Text, nullable=False),
    Column("state", String(32), nullable=False),
    Column("generation", Integer, nullable=False, server_default="0"),
    Column("owner_token", String(64)),
    Column("lease_expires_at", Float),
    Column("steps", Integer, nullable=False, server_default="0"),
    Column("final_output", Text),
    Column("end_reason", String(64)),
    Column("error", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("finished_at", Float),
    # JSON: the W3C trace context of the span that started the turn (migration 0011).
    Column("trace_context", Text),
)
Index(
    "ux_toolfence_turns_running",
    turns.c.tenant,
    turns.c.scope_key,
    unique=True,
    postgresql_where=turns.c.state == TURN_RUNNING,
    sqlite_where=turns.c.state == TURN_RUNNING,
)
Index(
    "ix_toolfence_turns_stale",
    turns.c.lease_expires_at,
    postgresql_where=turns.c.state == TURN_RUNNING,
    sqlite_where=turns.c.state == TURN_RUNNING,
)
Index(
    "ix_toolfence_turns_waiting",
    turns.c.updated_at,
    postgresql_where=turns.c.state == TURN_WAITING_APPROVAL,
    sqlite_where=turns.c.state == TURN_WAITING_APPROVAL,
)
Index("ix_toolfence_turns_conversation", turns.c.tenant, turns.c.conversation_id)

turn_steps = Table(
    "toolfence_turn_steps",
    metadata,
    Column("turn_id", String(64), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("outcome", String(32), nullable=False),
    Column("proposals", Text, nullable=False),
    Column("final_output", Text),
    Column("error", Text),
    Column("verdict", String(32)),
    Column("usage", Text, nullable=False),
    Column("request_id", String(200), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("recorded_at", Float, nullable=False),
    # The ids of the items the turn's surface listed to the model at this step
    # (migration 0010; a JSON list, NULL when none were listed).
    Column("offered", Text),
    # JSON: the W3C trace context of the step's `chat` span (migration 0011).
    Column("trace_context", Text),
)

# `toolfence serve` (migration 0008). One row per API key: the identity it stands
# for, its scopes, and only a slow hash of its secret; `key_id` is the key's public
# lookup prefix. Revoked keys stay, with `revoked_at`, for the audit's sake.
api_keys = Table(
    "toolfence_api_keys",
    metadata,
    Column("key_id", String(32), primary_key=True),
    Column("tenant", String(200), nullable=False),
    Column("principal", String(200), nullable=False),
    Column("roles", Text, nullable=False),
    Column("scopes", Text, nullable=False),
    Column("secret_hash", String(200), nullable=False),
    Column("label", String(200)),
    Column("created_at", Float, nullable=False),
    Column("revoked_at", Float),
    # The turn surface of POST /v1/turns under this key (migration 0010).
    Column("surface", String(64)),
)
Index("ix_toolfence_api_keys_tenant", api_keys.c.tenant, api_keys.c.created_at)

# A producer's Idempotency-Key, per (tenant, principal): the request it created and
# the digest of the body it came with.
http_idempotency = Table(
    "toolfence_http_idempotency",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("principal", String(200), primary_key=True),
    Column("idempotency_key", String(200), primary_key=True),
    Column("request_id", String(200), nullable=False),
    Column("body_digest", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
)

# Console sessions signed out before they expired (migration 0009): the cookie is
# signed, so a copy of it stays valid until its expiry unless the server remembers
# that it was ended. One row per ended session, kept until the session would have
# expired (then `prune_console_revocations` drops it).
console_revocations = Table(
    "toolfence_console_revocations",
    metadata,
    Column("session_id", String(64), primary_key=True),
    Column("expires_at", Float, nullable=False),
)
Index("ix_toolfence_console_revocations_expiry", console_revocations.c.expires_at)
