"""initial tables

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import orchestrator.store.tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chorus_conversation",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("root_id", sa.String(length=64), nullable=False),
        sa.Column("parent_id", sa.String(length=64), nullable=True),
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column(
            "agent_spec",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=True),
        sa.Column("cursor_step", sa.Integer(), nullable=False),
        sa.Column("cursor_segment", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column(
            "progress_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=False
        ),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column(
            "lease_until", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=True
        ),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("turns", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column(
            "created_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        op.f("ix_chorus_conversation_parent_id"), "chorus_conversation", ["parent_id"], unique=False
    )
    op.create_index(
        op.f("ix_chorus_conversation_root_id"), "chorus_conversation", ["root_id"], unique=False
    )
    op.create_index(
        "ix_chorus_conversation_running",
        "chorus_conversation",
        ["state", "progress_at"],
        unique=False,
    )
    op.create_table(
        "chorus_event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("root_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("correlation_id", sa.String(length=64), nullable=True),
        sa.Column(
            "data",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "created_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("root_id", "seq", name="uq_chorus_event_seq"),
    )
    op.create_table(
        "chorus_message",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column(
            "content",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("input_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column(
            "created_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("turn_id", "step", "kind", name="uq_chorus_message_slot"),
    )
    op.create_index(
        op.f("ix_chorus_message_conversation_id"),
        "chorus_message",
        ["conversation_id"],
        unique=False,
    )
    op.create_table(
        "chorus_tool_call",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("segment", sa.Integer(), nullable=False),
        sa.Column("tool_request_id", sa.String(length=200), nullable=False),
        sa.Column("tool", sa.String(length=200), nullable=False),
        sa.Column(
            "params",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("parallelizable", sa.Boolean(), nullable=False),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column(
            "result",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("is_error", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=True),
        sa.Column(
            "started_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=True
        ),
        sa.Column(
            "finished_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=True
        ),
        sa.Column(
            "created_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("turn_id", "step", "position", name="uq_chorus_tool_call_slot"),
    )
    op.create_index(
        op.f("ix_chorus_tool_call_turn_id"), "chorus_tool_call", ["turn_id"], unique=False
    )
    op.create_table(
        "chorus_turn",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("root_id", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("input_text", sa.Text(), nullable=False),
        sa.Column(
            "context_data",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("correlation_id", sa.String(length=64), nullable=False),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column(
            "started_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=False
        ),
        sa.Column(
            "finished_at", orchestrator.store.tables.UTCDateTime(timezone=True), nullable=True
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key"),
    )
    op.create_index(
        op.f("ix_chorus_turn_conversation_id"), "chorus_turn", ["conversation_id"], unique=False
    )
    op.create_index(op.f("ix_chorus_turn_root_id"), "chorus_turn", ["root_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_chorus_turn_root_id"), table_name="chorus_turn")
    op.drop_index(op.f("ix_chorus_turn_conversation_id"), table_name="chorus_turn")
    op.drop_table("chorus_turn")
    op.drop_index(op.f("ix_chorus_tool_call_turn_id"), table_name="chorus_tool_call")
    op.drop_table("chorus_tool_call")
    op.drop_index(op.f("ix_chorus_message_conversation_id"), table_name="chorus_message")
    op.drop_table("chorus_message")
    op.drop_table("chorus_event")
    op.drop_index("ix_chorus_conversation_running", table_name="chorus_conversation")
    op.drop_index(op.f("ix_chorus_conversation_root_id"), table_name="chorus_conversation")
    op.drop_index(op.f("ix_chorus_conversation_parent_id"), table_name="chorus_conversation")
    op.drop_table("chorus_conversation")
