"""large tool outputs: a call's result over its agent's limit is kept on its row

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("chorus_tool_call") as batch:
        batch.add_column(sa.Column("view_chars", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("chorus_tool_call") as batch:
        batch.drop_column("view_chars")
