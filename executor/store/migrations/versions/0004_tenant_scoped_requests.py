"""Request ids scoped by tenant; conversations; what a call id was used for.

- `toolfence_operations.tenant` (backfilled from the stored server context) and
  `conversation_id`; proposal order is per (tenant, request id), so the request
  index leads with the tenant; repeated writes of a conversation are found
  through (tenant, conversation_id, intent_hash).
- `toolfence_calls` is keyed by (tenant, request id, call id): two tenants may use
  one request id. Its tenant is backfilled from the operation a row points at, or
  from another call of the same request that has one; a rejected call of a request
  none of whose calls was admitted keeps tenant '' (its context was never stored).
  `proposal_hash` (what the call id was used for: re-enqueue vs conflict),
  `reused_from_call_id` (a repeated write answered from an earlier call) and
  `conversation_id` (budgets count a conversation's calls) are new.

Existing operation ids stay valid: ids are only derived for new calls, and a
re-enqueued call finds its operation through its call row.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

NOT_NULL_CONVERSATION = sa.text("conversation_id IS NOT NULL")


def _calls_table(key: list[str]) -> sa.Table:
    """toolfence_calls with every column of this revision, keyed by `key`."""
    columns: list[sa.schema.SchemaItem] = [
        sa.Column("tenant", sa.String(200), nullable=False, server_default=""),
        sa.Column("request_id", sa.String(200), nullable=False),
        sa.Column("call_id", sa.String(200), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("tool_name", sa.String(200), nullable=False),
        sa.Column("operation_id", sa.String(200)),
        sa.Column("gate", sa.String(32)),
        sa.Column("result", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("conversation_id", sa.String(200)),
        sa.Column("proposal_hash", sa.String(64)),
        sa.Column("reused_from_call_id", sa.String(200)),
    ]
    table = sa.Table(
        "toolfence_calls", sa.MetaData(), *columns, sa.PrimaryKeyConstraint(*key, name="toolfence_calls_pkey")
    )
    sa.Index("ix_toolfence_calls_operation", table.c.operation_id)
    sa.Index("ix_toolfence_calls_created", table.c.created_at)
    return table


def _replace_calls_key(key: list[str]) -> None:
    """SQLite cannot alter a primary key: batch mode copies the table into one with
    the new key (described here, not reflected: the old key was never named)."""
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table(
            "toolfence_calls", copy_from=_calls_table(key), recreate="always"
        ):
            pass
        return
    op.drop_constraint("toolfence_calls_pkey", "toolfence_calls", type_="primary")
    op.create_primary_key("toolfence_calls_pkey", "toolfence_calls", key)


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    with op.batch_alter_table("toolfence_operations") as batch:
        batch.add_column(sa.Column("tenant", sa.String(200), nullable=False, server_default=""))
        batch.add_column(sa.Column("conversation_id", sa.String(200)))
    tenant_of_context = (
        "(context::json ->> 'tenant')" if dialect == "postgresql" else "json_extract(context, '$.tenant')"
    )
    op.execute(
        f"UPDATE toolfence_operations SET tenant = COALESCE({tenant_of_context}, '') WHERE tenant = ''"
    )
    op.drop_index("ix_toolfence_operations_request", table_name="toolfence_operations")
    op.create_index(
        "ix_toolfence_operations_request",
        "toolfence_operations",
        ["tenant", "request_id", "position"],
    )
    op.create_index(
        "ix_toolfence_operations_conversation_intent",
        "toolfence_operations",
        ["tenant", "conversation_id", "intent_hash"],
        postgresql_where=NOT_NULL_CONVERSATION,
        sqlite_where=NOT_NULL_CONVERSATION,
    )

    with op.batch_alter_table("toolfence_calls") as batch:
        batch.add_column(sa.Column("tenant", sa.String(200), nullable=False, server_default=""))
        batch.add_column(sa.Column("conversation_id", sa.String(200)))
        batch.add_column(sa.Column("proposal_hash", sa.String(64)))
        batch.add_column(sa.Column("reused_from_call_id", sa.String(200)))
    op.execute(
        "UPDATE toolfence_calls SET tenant = COALESCE(("
        " SELECT o.tenant FROM toolfence_operations o"
        " WHERE o.operation_id = toolfence_calls.operation_id), '')"
        " WHERE operation_id IS NOT NULL"
    )
    op.execute(
        "UPDATE toolfence_calls SET tenant = COALESCE(("
        " SELECT MIN(o.tenant) FROM toolfence_operations o"
        " WHERE o.request_id = toolfence_calls.request_id), '')"
        " WHERE tenant = ''"
    )
    _replace_calls_key(["tenant", "request_id", "call_id"])
    op.create_index(
        "ix_toolfence_calls_conversation",
        "toolfence_calls",
        ["tenant", "conversation_id", "tool_name"],
        postgresql_where=NOT_NULL_CONVERSATION,
        sqlite_where=NOT_NULL_CONVERSATION,
    )


def downgrade() -> None:
    op.drop_index("ix_toolfence_calls_conversation", table_name="toolfence_calls")
    _replace_calls_key(["request_id", "call_id"])
    with op.batch_alter_table("toolfence_calls") as batch:
        batch.drop_column("reused_from_call_id")
        batch.drop_column("proposal_hash")
        batch.drop_column("conversation_id")
        batch.drop_column("tenant")
    op.drop_index("ix_toolfence_operations_conversation_intent", table_name="toolfence_operations")
    op.drop_index("ix_toolfence_operations_request", table_name="toolfence_operations")
    op.create_index(
        "ix_toolfence_operations_request", "toolfence_operations", ["request_id", "position"]
    )
    with op.batch_alter_table("toolfence_operations") as batch:
        batch.drop_column("conversation_id")
        batch.drop_column("tenant")
