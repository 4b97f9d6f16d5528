"""event numbering: seq from the writing transaction's id (bigint); no per-root counter

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing events keep their small numbers: every new one sorts after
    # them (a transaction id shifted by 20 bits is far above any counter).
    with op.batch_alter_table("chorus_event") as batch:
        batch.alter_column("seq", existing_type=sa.Integer(), type_=sa.BigInteger())
    with op.batch_alter_table("chorus_conversation") as batch:
        batch.drop_column("event_seq")


def downgrade() -> None:
    with op.batch_alter_table("chorus_conversation") as batch:
        batch.add_column(sa.Column("event_seq", sa.Integer(), nullable=False, server_default="0"))
    # Numbers above the range of an integer cannot go back: every root's
    # events are renumbered 1, 2, … in their order (through negative numbers,
    # so the unique (root_id, seq) holds at every row), and the root's
    # counter resumes after the last.
    op.execute(
        "UPDATE chorus_event SET seq = -numbered.n FROM ("
        " SELECT id, row_number() OVER (PARTITION BY root_id ORDER BY seq) AS n"
        " FROM chorus_event) AS numbered WHERE chorus_event.id = numbered.id"
    )
    op.execute("UPDATE chorus_event SET seq = -seq")
    op.execute(
        "UPDATE chorus_conversation SET event_seq = COALESCE((SELECT MAX(seq)"
        " FROM chorus_event WHERE chorus_event.root_id = chorus_conversation.id), 0)"
    )
    with op.batch_alter_table("chorus_event") as batch:
        batch.alter_column("seq", existing_type=sa.BigInteger(), type_=sa.Integer())
