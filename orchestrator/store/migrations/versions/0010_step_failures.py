"""retry counts in a column: a conversation's failed model calls at its cursor

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("chorus_conversation") as batch:
        batch.add_column(
            sa.Column("step_failures", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column(
                "step_failure_log",
                sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
                nullable=True,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("chorus_conversation") as batch:
        batch.drop_column("step_failure_log")
        batch.drop_column("step_failures")
