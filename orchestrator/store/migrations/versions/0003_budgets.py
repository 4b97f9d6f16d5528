"""budgets and structured output: job link, budget, tree usage, structured result

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_COUNTERS = {
    "tree_input_tokens": sa.Integer(),
    "tree_output_tokens": sa.Integer(),
    "tree_cost_usd": sa.Float(),
    "tree_steps": sa.Integer(),
    "tree_tool_calls": sa.Integer(),
}


def upgrade() -> None:
    op.add_column("chorus_turn", sa.Column("job_id", sa.String(length=64), nullable=True))
    op.add_column("chorus_turn", sa.Column("budget", _JSON, nullable=True))
    for name, type_ in _COUNTERS.items():
        op.add_column("chorus_turn", sa.Column(name, type_, nullable=False, server_default="0"))
    op.add_column("chorus_turn", sa.Column("structured", _JSON, nullable=True))
    op.create_index("ix_chorus_turn_job_id", "chorus_turn", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_chorus_turn_job_id", table_name="chorus_turn")
    with op.batch_alter_table("chorus_turn") as batch:
        for name in ["structured", *_COUNTERS, "budget", "job_id"]:
            batch.drop_column(name)
