"""Provider-run (hosted) calls: one append-only row per item a response reports.

`toolfence_hosted_calls` records every hosted call toolfence read from a
provider response (an MCP call, a web search, code execution ...), whether the
application's hosted-tool policy allowed it, and, for one it did not, the call
id of the `failed_terminal` result the request reports it under. Never the
arguments or the output: only the output's digest. `hosted_call_id` is the
item's key within its request (unique per tenant and request), so recording
the same response twice adds nothing. A new table: no backfill.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "toolfence_hosted_calls",
        sa.Column(
            "hosted_call_row_id", sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True, autoincrement=True,
        ),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("request_id", sa.String(200), nullable=False),
        sa.Column("hosted_call_id", sa.String(200), nullable=False),
        sa.Column("surface", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("server_label", sa.String(200)),
        sa.Column("tool_name", sa.String(200)),
        sa.Column("item_id", sa.String(200)),
        sa.Column("status", sa.String(32)),
        sa.Column("output_digest", sa.String(64)),
        sa.Column("allowed", sa.Boolean),
        sa.Column("code", sa.String(64)),
        sa.Column("call_id", sa.String(200)),
        sa.Column("recorded_at", sa.Float, nullable=False),
    )
    op.create_index(
        "ux_toolfence_hosted_calls_key",
        "toolfence_hosted_calls",
        ["tenant", "request_id", "hosted_call_id"],
        unique=True,
    )
    op.create_index("ix_toolfence_hosted_calls_recorded", "toolfence_hosted_calls", ["recorded_at"])


def downgrade() -> None:
    op.drop_index("ix_toolfence_hosted_calls_recorded", table_name="toolfence_hosted_calls")
    op.drop_index("ux_toolfence_hosted_calls_key", table_name="toolfence_hosted_calls")
    op.drop_table("toolfence_hosted_calls")
