"""Initial schema: operations, calls, outbox, audit events, receipts, approvals.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ACTIVE = ("pending_approval", "queued", "started", "retry_wait", "reconciliation_pending")
ID = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def _partial(where: str) -> dict[str, Any]:
    clause = sa.text(where)
    return {"postgresql_where": clause, "sqlite_where": clause}


def upgrade() -> None:
    op.create_table(
        "toolfence_operations",
        sa.Column("operation_id", sa.String(200), primary_key=True),
        sa.Column("request_id", sa.String(200), nullable=False),
        sa.Column("call_id", sa.String(200), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("tool_name", sa.String(200), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
        sa.Column("owner_token", sa.String(64)),
        sa.Column("lease_expires_at", sa.Float),
        sa.Column("intent_hash", sa.String(64), nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("context", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("available_at", sa.Float, nullable=False),
        sa.Column("queued_at", sa.Float),
        sa.Column("result", sa.Text),
        sa.Column("receipt", sa.String(200)),
        sa.Column("error_code", sa.String(64)),
        sa.Column("error", sa.Text),
        sa.Column("impact", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float),
        sa.Column("finished_at", sa.Float),
        sa.CheckConstraint("generation >= 0", name="ck_toolfence_operations_generation"),
        sa.CheckConstraint(
            "state IN ('pending_approval','queued','started','retry_wait','succeeded',"
            "'failed_terminal','reconciliation_pending')",
            name="ck_toolfence_operations_state",
        ),
    )
    op.create_index(
        "ix_toolfence_operations_stale_started", "toolfence_operations", ["lease_expires_at"],
        **_partial("state = 'started'"),
    )
    op.create_index(
        "ix_toolfence_operations_queued", "toolfence_operations", ["queued_at"],
        **_partial("state = 'queued'"),
    )
    op.create_index(
        "ix_toolfence_operations_retry_wait", "toolfence_operations", ["available_at"],
        **_partial("state = 'retry_wait'"),
    )
    active = ", ".join(f"'{s}'" for s in ACTIVE)
    op.create_index(
        "ix_toolfence_operations_active", "toolfence_operations", ["state", "updated_at"],
        **_partial(f"state IN ({active})"),
    )
    op.create_index(
        "ix_toolfence_operations_request", "toolfence_operations", ["request_id", "position"]
    )

    op.create_table(
        "toolfence_calls",
        sa.Column("request_id", sa.String(200), primary_key=True),
        sa.Column("call_id", sa.String(200), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("tool_name", sa.String(200), nullable=False),
        sa.Column("operation_id", sa.String(200)),
        sa.Column("gate", sa.String(32)),
        sa.Column("result", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_toolfence_calls_operation", "toolfence_calls", ["operation_id"])

    op.create_table(
        "toolfence_outbox",
        sa.Column("outbox_id", ID, primary_key=True, autoincrement=True),
        sa.Column("operation_id", sa.String(200), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("published_at", sa.Float),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.Float, nullable=False),
        sa.Column("last_error", sa.Text),
    )
    op.create_index(
        "ix_toolfence_outbox_unpublished", "toolfence_outbox", ["next_attempt_at", "outbox_id"],
        **_partial("published_at IS NULL"),
    )

    op.create_table(
        "toolfence_audit_events",
        sa.Column("event_id", ID, primary_key=True, autoincrement=True),
        sa.Column("operation_id", sa.String(200), nullable=False),
        sa.Column("call_id", sa.String(200)),
        sa.Column("tool_name", sa.String(200)),
        sa.Column("schema_version", sa.Integer),
        sa.Column("from_state", sa.String(32)),
        sa.Column("to_state", sa.String(32), nullable=False),
        sa.Column("decision_code", sa.String(64), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("intent_hash", sa.String(64)),
        sa.Column("actor", sa.String(200)),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("duration_ms", sa.Float),
    )
    op.create_index(
        "ix_toolfence_audit_operation", "toolfence_audit_events", ["operation_id", "event_id"]
    )

    op.create_table(
        "toolfence_receipts",
        sa.Column("receipt_row_id", ID, primary_key=True, autoincrement=True),
        sa.Column("operation_id", sa.String(200), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("receipt", sa.String(200), nullable=False),
        sa.Column("accepted", sa.Boolean, nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("recorded_at", sa.Float, nullable=False),
    )
    op.create_index("ix_toolfence_receipts_operation", "toolfence_receipts", ["operation_id"])

    op.create_table(
        "toolfence_approvals",
        sa.Column("approval_id", sa.String(64), primary_key=True),
        sa.Column("operation_id", sa.String(200), nullable=False, unique=True),
        sa.Column("intent_hash", sa.String(64), nullable=False),
        sa.Column("impact", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("requested_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("decided_at", sa.Float),
        sa.Column("decided_by", sa.String(200)),
        sa.Column("reason", sa.Text),
    )
    op.create_index(
        "ix_toolfence_approvals_pending", "toolfence_approvals", ["requested_at"],
        **_partial("state = 'pending'"),
    )


def downgrade() -> None:
    for table in (
        "toolfence_approvals",
        "toolfence_receipts",
        "toolfence_audit_events",
        "toolfence_outbox",
        "toolfence_calls",
        "toolfence_operations",
    ):
        op.drop_table(table)
