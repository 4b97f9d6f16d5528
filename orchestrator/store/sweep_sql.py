"""The sweeper's reads and writes: stalled cursors, the calls of a
position, a re-dispatch counted, and the jobs to stop.

Every time compared here is the database's (:mod:`orchestrator.store.clock`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import and_, literal, or_, update
from sqlmodel import Session, col, select

from orchestrator.store.clock import NOW, db_now, shifted
from orchestrator.store.tables import Conversation, ToolCallRow, Turn, table
from schemas import ConversationState, TurnStatus


def stalled(session: Session, stall: float, limit: int) -> tuple[datetime, Sequence[str]]:
    """The database's time, and the ids of up to ``limit`` running
    conversations whose cursor has not moved for ``stall`` seconds, oldest
    first (each one's own back-off is checked after). A deferred step
    (retry, rate limit) is not stalled before it is due."""
    ago = db_now(literal(-stall))
    now: datetime = session.execute(NOW).scalar_one()
    ids = session.exec(
        select(Conversation.id)
        .where(
            Conversation.state == ConversationState.RUNNING.value,
            col(Conversation.progress_at) < ago,
            or_(col(Conversation.due_at).is_(None), col(Conversation.due_at) < ago),
        )
        .order_by(col(Conversation.progress_at))
        .limit(limit)
    ).all()
    return now, ids


def position_calls(
    session: Session, turn_id: str, step: int, segment: int
) -> Sequence[ToolCallRow]:
    """The tool calls of one segment of a step."""
    return session.exec(
        select(ToolCallRow).where(
            ToolCallRow.turn_id == turn_id,
            ToolCallRow.step == step,
            ToolCallRow.segment == segment,
        )
    ).all()


def count_redispatch(session: Session, conversation_id: str, version: int, count: int) -> bool:
    """Restart the stall clock of a cursor still at ``version`` and
    re-dispatched ``count`` times so far, and count one more. The version is
    untouched, so a copy already running still matches the cursor. False if
    the cursor moved or another sweeper counted first."""
    moved = session.execute(
        update(Conversation)
        .where(
            col(Conversation.id) == conversation_id,
            col(Conversation.version) == version,
            col(Conversation.redispatches) == count,
        )
        .values(progress_at=db_now(), redispatches=count + 1)
    )
    return bool(moved.rowcount == 1)  # type: ignore[attr-defined]


def jobs_to_stop(session: Session, limit: int) -> Sequence[Turn]:
    """Running jobs marked stopping, and those past their wall-time budget
    (the database's clock), oldest first. Only those are read, so however
    many running jobs have a wall-time budget, every one past it is reached."""
    wall = col(Turn.budget)["wall_seconds"].as_float()
    return session.exec(
        select(Turn)
        .where(
            Turn.status == TurnStatus.RUNNING.value,
            col(Turn.job_id) == col(Turn.id),
            or_(
                col(Turn.stop_status).is_not(None),
                and_(wall.is_not(None), shifted(table(Turn).c.started_at, wall) <= db_now()),
            ),
        )
        .order_by(col(Turn.started_at))
        .limit(limit)
    ).all()
