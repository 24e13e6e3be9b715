"""Durable turns: `toolfence_turns`, `toolfence_turn_steps`, and the outbox's `kind`.

A turn is a user's message run as a durable job: the model's steps are
checkpointed in `toolfence_turn_steps` (one row per model step, keyed by turn
and step number) before their calls are enqueued. The database owns "one running
turn per user": `ux_toolfence_turns_running` is a partial unique index on
(tenant, scope_key) where state = 'running'; `scope_key` is the principal or the
conversation, by setting (`TOOLFENCE_TURN_SCOPE`). Turn ownership is a lease
with a generation, like an operation's.

`toolfence_outbox.kind` tells the relay what a row asks it to publish: NULL is an
operation (every existing row), 'turn' a turn job. New tables and a nullable
column: no backfill.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "toolfence_turns",
        sa.Column("turn_id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("principal", sa.String(200), nullable=False),
        sa.Column("conversation_id", sa.String(200), nullable=False),
        sa.Column("scope_key", sa.String(420), nullable=False),
        sa.Column("context", sa.Text, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("driver", sa.String(1000), nullable=False),
        sa.Column("options", sa.Text, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
        sa.Column("owner_token", sa.String(64)),
        sa.Column("lease_expires_at", sa.Float),
        sa.Column("steps", sa.Integer, nullable=False, server_default="0"),
        sa.Column("final_output", sa.Text),
        sa.Column("end_reason", sa.String(64)),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float),
    )
    op.create_index(
        "ux_toolfence_turns_running",
        "toolfence_turns",
        ["tenant", "scope_key"],
        unique=True,
        postgresql_where=sa.text("state = 'running'"),
        sqlite_where=sa.text("state = 'running'"),
    )
    op.create_index(
        "ix_toolfence_turns_stale",
        "toolfence_turns",
        ["lease_expires_at"],
        postgresql_where=sa.text("state = 'running'"),
        sqlite_where=sa.text("state = 'running'"),
    )
    op.create_index(
        "ix_toolfence_turns_waiting",
        "toolfence_turns",
        ["updated_at"],
        postgresql_where=sa.text("state = 'waiting_approval'"),
        sqlite_where=sa.text("state = 'waiting_approval'"),
    )
    op.create_index("ix_toolfence_turns_conversation", "toolfence_turns", ["tenant", "conversation_id"])
    op.create_table(
        "toolfence_turn_steps",
        sa.Column("turn_id", sa.String(64), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("proposals", sa.Text, nullable=False),
        sa.Column("final_output", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("verdict", sa.String(32)),
        sa.Column("usage", sa.Text, nullable=False),
        sa.Column("request_id", sa.String(200), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("recorded_at", sa.Float, nullable=False),
    )
    # A plain ADD COLUMN (SQLite has it for a nullable column): a batch rebuild of the
    # outbox could lose its partial index's WHERE term.
    op.add_column("toolfence_outbox", sa.Column("kind", sa.String(16)))


def downgrade() -> None:
    with op.batch_alter_table("toolfence_outbox") as batch:
        batch.drop_column("kind")
    op.drop_table("toolfence_turn_steps")
    op.drop_index("ix_toolfence_turns_conversation", table_name="toolfence_turns")
    op.drop_index("ix_toolfence_turns_waiting", table_name="toolfence_turns")
    op.drop_index("ix_toolfence_turns_stale", table_name="toolfence_turns")
    op.drop_index("ux_toolfence_turns_running", table_name="toolfence_turns")
    op.drop_table("toolfence_turns")
