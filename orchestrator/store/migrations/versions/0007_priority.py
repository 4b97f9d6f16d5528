"""priority: the priority of the job a conversation's turn belongs to

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "chorus_conversation",
        sa.Column("priority", sa.Integer(), nullable=False, server_default="5"),
    )


def downgrade() -> None:
    with op.batch_alter_table("chorus_conversation") as batch:
        batch.drop_column("priority")
