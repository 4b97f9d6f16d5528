"""subagents: conversation depth and child count, child turns' parent call,
message slots unique per conversation (forks copy messages)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "chorus_conversation", sa.Column("depth", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "chorus_conversation",
        sa.Column("children", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column("chorus_turn", sa.Column("parent_call_id", sa.String(length=64), nullable=True))
    op.create_index("ix_chorus_turn_correlation_id", "chorus_turn", ["correlation_id"])
    op.create_index("ix_chorus_turn_parent_call_id", "chorus_turn", ["parent_call_id"], unique=True)
    with op.batch_alter_table("chorus_message") as batch:
        batch.drop_constraint("uq_chorus_message_slot", type_="unique")
        batch.create_unique_constraint(
            "uq_chorus_message_slot", ["conversation_id", "turn_id", "step", "kind"]
        )


def downgrade() -> None:
    with op.batch_alter_table("chorus_message") as batch:
        batch.drop_constraint("uq_chorus_message_slot", type_="unique")
        batch.create_unique_constraint("uq_chorus_message_slot", ["turn_id", "step", "kind"])
    op.drop_index("ix_chorus_turn_parent_call_id", table_name="chorus_turn")
    op.drop_index("ix_chorus_turn_correlation_id", table_name="chorus_turn")
    with op.batch_alter_table("chorus_turn") as batch:
        batch.drop_column("parent_call_id")
    with op.batch_alter_table("chorus_conversation") as batch:
        batch.drop_column("children")
        batch.drop_column("depth")
