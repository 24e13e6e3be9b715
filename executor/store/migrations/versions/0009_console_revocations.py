"""`toolfence serve`'s console: sessions signed out before their expiry.

`toolfence_console_revocations` holds the id of each console session its person
signed out of, until the session would have expired: a copy of the signed cookie
is refused after sign-out, across server restarts (decision 0200). New table: no
backfill.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "toolfence_console_revocations",
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index(
        "ix_toolfence_console_revocations_expiry", "toolfence_console_revocations", ["expires_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_toolfence_console_revocations_expiry", table_name="toolfence_console_revocations")
    op.drop_table("toolfence_console_revocations")
