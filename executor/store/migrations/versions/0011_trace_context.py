"""Trace context: the W3C trace context stored with an operation, a turn and a step.

`toolfence_operations.trace_context` holds, as one JSON object, the traceparent
(and tracestate) of the request span that registered the operation and of its
last execution attempt's span (executor/telemetry/tracing.py), so a retry, a
take-over by a new generation and a reconciler sweep join the request's trace.
`toolfence_turns.trace_context` is the context of the span that started the turn
(its model steps are its children), `toolfence_turn_steps.trace_context` that of
the step's `chat` span (the step's calls, enqueued perhaps by a later job, join
it). Nullable, no backfill: NULL is "traced by nobody" (tracing was off),
decision 0215.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("toolfence_operations", "toolfence_turns", "toolfence_turn_steps"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("trace_context", sa.Text, nullable=True))


def downgrade() -> None:
    for table in ("toolfence_turn_steps", "toolfence_turns", "toolfence_operations"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("trace_context")
