"""Indexes that keep the exporter's invariant checks (I1, I6) bounded.

Both checks look only at rows written within a recent window, so each needs a
range scan by time: accepted receipts by `recorded_at`, calls by `created_at`.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _create_indexes(concurrently: bool) -> None:
    op.create_index(
        "ix_toolfence_receipts_accepted_recorded",
        "toolfence_receipts",
        ["recorded_at", "operation_id"],
        # PostgreSQL proves `accepted = true` implies `accepted`; SQLite matches a
        # partial index only when the query repeats the index's WHERE term.
        postgresql_where=sa.text("accepted"),
        sqlite_where=sa.text("accepted = 1"),
        postgresql_concurrently=concurrently,
    )
    op.create_index(
        "ix_toolfence_calls_created",
        "toolfence_calls",
        ["created_at"],
        postgresql_concurrently=concurrently,
    )


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # Both tables grow with every call: a plain CREATE INDEX would block the
        # producers' and workers' writes for the whole build on a large table.
        with op.get_context().autocommit_block():
            _create_indexes(concurrently=True)
    else:
        _create_indexes(concurrently=False)


def downgrade() -> None:
    op.drop_index("ix_toolfence_calls_created", table_name="toolfence_calls")
    op.drop_index("ix_toolfence_receipts_accepted_recorded", table_name="toolfence_receipts")
