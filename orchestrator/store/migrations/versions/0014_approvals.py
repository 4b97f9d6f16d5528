"""human approvals: a tool call's wait for a person's answer, and the answer

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from orchestrator.store.tables import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_AWAITING = sa.text("status = 'awaiting'")


def upgrade() -> None:
    with op.batch_alter_table("chorus_tool_call") as batch:
        batch.add_column(
            sa.Column("approval_requested_at", UTCDateTime(timezone=True), nullable=True)
        )
        batch.add_column(sa.Column("approval_deadline", UTCDateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("answer", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("answered_by", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("answered_at", UTCDateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("answer_note", sa.Text(), nullable=True))
    op.create_index(
        "ix_chorus_tool_call_awaiting",
        "chorus_tool_call",
        ["approval_deadline"],
        postgresql_where=_AWAITING,
        sqlite_where=_AWAITING,
    )


def downgrade() -> None:
    op.drop_index("ix_chorus_tool_call_awaiting", table_name="chorus_tool_call")
    with op.batch_alter_table("chorus_tool_call") as batch:
        for column in (
            "answer_note",
            "answered_at",
            "answered_by",
            "answer",
            "approval_deadline",
            "approval_requested_at",
        ):
            batch.drop_column(column)
