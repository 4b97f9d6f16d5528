"""structured-output retries in a column: a turn's rejected final answers and nudges

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A turn running across the upgrade counts its output attempts from 0 again.
    with op.batch_alter_table("chorus_turn") as batch:
        batch.add_column(
            sa.Column("output_attempts", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("chorus_turn") as batch:
        batch.drop_column("output_attempts")
