"""durability: deferred steps, sweeper re-dispatch counts, per-job children, durable stop marks

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import orchestrator.store.tables

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "chorus_conversation",
        sa.Column("due_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=True),
    )
    op.add_column(
        "chorus_conversation",
        sa.Column("redispatches", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column(
        "chorus_turn",
        sa.Column("tree_children", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column("chorus_turn", sa.Column("stop_status", sa.String(length=16), nullable=True))
    op.add_column("chorus_turn", sa.Column("stop_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("chorus_turn") as batch:
        batch.drop_column("stop_reason")
        batch.drop_column("stop_status")
        batch.drop_column("tree_children")
    with op.batch_alter_table("chorus_conversation") as batch:
        batch.drop_column("redispatches")
        batch.drop_column("due_at")
