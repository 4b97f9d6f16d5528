"""A stop's writes: the job's mark, its tree's running turns, and the
cancelled calls of one turn (:mod:`orchestrator.engine.cancel`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col, select

from orchestrator.store.tables import CALL_FINISHED, Conversation, ToolCallRow, Turn, utcnow
from schemas import TurnStatus


def mark_stop(session: Session, job_id: str, status: str, reason: str) -> bool:
    """Mark the running job as stopping, unless a stop marked it first;
    True if this mark won."""
    marked = session.execute(
        update(Turn)
        .where(
            col(Turn.id) == job_id,
            col(Turn.status) == TurnStatus.RUNNING.value,
            col(Turn.stop_status).is_(None),
        )
        .values(stop_status=status, stop_reason=reason)
    )
    return bool(marked.rowcount == 1)  # type: ignore[attr-defined]


def running_turns(session: Session, correlation_id: str) -> Sequence[tuple[Turn, int]]:
    """The running turns of a job's tree, with their conversation's depth."""
    return session.exec(
        select(Turn, Conversation.depth)
        .join(Conversation, col(Conversation.id) == Turn.conversation_id)
        .where(Turn.correlation_id == correlation_id, Turn.status == TurnStatus.RUNNING.value)
    ).all()


def cancel_calls(session: Session, turn_id: str) -> Sequence[Any]:
    """Record the turn's unfinished calls ``cancelled``; returns each one's
    id, tool, tool request id and step."""
    return session.execute(
        update(ToolCallRow)
        .where(col(ToolCallRow.turn_id) == turn_id, col(ToolCallRow.status).not_in(CALL_FINISHED))
        .values(status="cancelled", result="cancelled", is_error=True, finished_at=utcnow())
        .returning(
            col(ToolCallRow.id),
            col(ToolCallRow.tool),
            col(ToolCallRow.tool_request_id),
            col(ToolCallRow.step),
        )
    ).all()
