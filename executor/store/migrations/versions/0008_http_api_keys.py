"""`toolfence serve`: API keys and the HTTP Idempotency-Key map.

`toolfence_api_keys` holds one row per key: its lookup prefix (the public part
of the key, `tfk_<key_id>_…`), the identity it stands for (tenant, principal,
roles) and the scopes it grants, and only a slow (argon2id) hash of the secret.
`toolfence_http_idempotency` maps a producer's `Idempotency-Key` to the request
it created and the digest of the body it came with, so a retried POST is
answered from that request and a different body under the same key is refused.
New tables: no backfill.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "toolfence_api_keys",
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("principal", sa.String(200), nullable=False),
        sa.Column("roles", sa.Text, nullable=False),
        sa.Column("scopes", sa.Text, nullable=False),
        sa.Column("secret_hash", sa.String(200), nullable=False),
        sa.Column("label", sa.String(200)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float),
    )
    op.create_index("ix_toolfence_api_keys_tenant", "toolfence_api_keys", ["tenant", "created_at"])
    op.create_table(
        "toolfence_http_idempotency",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("principal", sa.String(200), primary_key=True),
        sa.Column("idempotency_key", sa.String(200), primary_key=True),
        sa.Column("request_id", sa.String(200), nullable=False),
        sa.Column("body_digest", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("toolfence_http_idempotency")
    op.drop_index("ix_toolfence_api_keys_tenant", table_name="toolfence_api_keys")
    op.drop_table("toolfence_api_keys")
