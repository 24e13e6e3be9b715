"""The resource ids a write was admitted and approved for (approved set = changed set).

A write that declares `resources` keeps the set admission computed on its
operation: the handler receives it as `ctx.approved_resources`, and the worker
compares it with the set the handler reports it changed. NULL for every other
operation, so existing rows need no backfill.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column without a default: PostgreSQL adds it without rewriting the
    # table; SQLite's batch mode copies the table, as it must for any ALTER there.
    with op.batch_alter_table("toolfence_operations") as batch:
        batch.add_column(sa.Column("approved_resources", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("toolfence_operations") as batch:
        batch.drop_column("approved_resources")
