"""the HTTP API: bearer tokens, and the tenant of a root conversation

Revision ID: 0013
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from orchestrator.store.tables import UTCDateTime

revision = "0013"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chorus_api_token",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("prefix"),
    )
    with op.batch_alter_table("chorus_conversation") as batch:
        batch.add_column(sa.Column("tenant", sa.String(length=64), nullable=True))
        batch.create_index("ix_chorus_conversation_tenant", ["tenant"])


def downgrade() -> None:
    with op.batch_alter_table("chorus_conversation") as batch:
        batch.drop_index("ix_chorus_conversation_tenant")
        batch.drop_column("tenant")
    op.drop_table("chorus_api_token")
