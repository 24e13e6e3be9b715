"""Turn surfaces: the items a step listed, and the surface an API key's turns run in.

`toolfence_turn_steps.offered` holds the ids of the items the server listed to
the model at that step (a JSON list; NULL when the turn's surface lists none),
so the step's calls are admitted, and re-checked by the worker, against the list
the model was shown, also after a takeover. `toolfence_api_keys.surface` names
the turn surface of `POST /v1/turns` under that key (NULL: the server's
`TOOLFENCE_TURN_SURFACE`). Nullable columns: no backfill, existing rows keep
their meaning (decision 0205).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("toolfence_turn_steps") as batch:
        batch.add_column(sa.Column("offered", sa.Text, nullable=True))
    with op.batch_alter_table("toolfence_api_keys") as batch:
        batch.add_column(sa.Column("surface", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("toolfence_api_keys") as batch:
        batch.drop_column("surface")
    with op.batch_alter_table("toolfence_turn_steps") as batch:
        batch.drop_column("offered")
