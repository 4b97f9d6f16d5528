"""checkpoints: summaries of conversations, conversation kind

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import orchestrator.store.tables

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chorus_checkpoint",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("boundary_message_id", sa.Integer(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("summarizer_conversation_id", sa.String(length=64), nullable=False),
        sa.Column(
            "created_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_chorus_checkpoint_conversation_id", "chorus_checkpoint", ["conversation_id"]
    )
    op.add_column(
        "chorus_conversation",
        sa.Column("kind", sa.String(length=16), nullable=False, server_default="main"),
    )


def downgrade() -> None:
    with op.batch_alter_table("chorus_conversation") as batch:
        batch.drop_column("kind")
    op.drop_index("ix_chorus_checkpoint_conversation_id", table_name="chorus_checkpoint")
    op.drop_table("chorus_checkpoint")
