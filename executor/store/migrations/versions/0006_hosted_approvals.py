"""Hosted approvals: toolfence's own approval of an `mcp_approval_request`.

`toolfence_hosted_approvals` holds one row per approval request a provider asked
within the hosted-tool policy, bound to the intent hash of (tenant, server
label, tool, canonical arguments), with the redacted impact an approver is shown
(never the provider's arguments), the requester's context, and the decision
(pending → approved | denied | expired, once). `toolfence_hosted_approval_events`
is its append-only audit trail (the operation audit table needs an operation
id). New tables: no backfill.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "toolfence_hosted_approvals",
        sa.Column("approval_id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("request_id", sa.String(200), nullable=False),
        sa.Column("approval_request_id", sa.String(200), nullable=False),
        sa.Column("surface", sa.String(32), nullable=False),
        sa.Column("server_label", sa.String(200), nullable=False),
        sa.Column("tool_name", sa.String(200), nullable=False),
        sa.Column("intent_hash", sa.String(64), nullable=False),
        sa.Column("impact", sa.Text, nullable=False),
        sa.Column("context", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("requested_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("decided_at", sa.Float),
        sa.Column("decided_by", sa.String(200)),
        sa.Column("reason", sa.Text),
    )
    op.create_index(
        "ux_toolfence_hosted_approvals_request",
        "toolfence_hosted_approvals",
        ["tenant", "approval_request_id"],
        unique=True,
    )
    op.create_index(
        "ix_toolfence_hosted_approvals_pending",
        "toolfence_hosted_approvals",
        ["expires_at"],
        postgresql_where=sa.text("state = 'pending'"),
        sqlite_where=sa.text("state = 'pending'"),
    )
    op.create_table(
        "toolfence_hosted_approval_events",
        sa.Column(
            "event_id", sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True, autoincrement=True,
        ),
        sa.Column("approval_id", sa.String(64), nullable=False),
        sa.Column("from_state", sa.String(16)),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("decision_code", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(200)),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index(
        "ix_toolfence_hosted_approval_events_approval",
        "toolfence_hosted_approval_events",
        ["approval_id", "event_id"],
    )


def downgrade() -> None:
    op.drop_index(
        "ix_toolfence_hosted_approval_events_approval", table_name="toolfence_hosted_approval_events"
    )
    op.drop_table("toolfence_hosted_approval_events")
    op.drop_index("ix_toolfence_hosted_approvals_pending", table_name="toolfence_hosted_approvals")
    op.drop_index("ux_toolfence_hosted_approvals_request", table_name="toolfence_hosted_approvals")
    op.drop_table("toolfence_hosted_approvals")
