"""The conversation cursor: compare-and-set moves and turn endings."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, update
from sqlmodel import Session, col

from orchestrator.engine.actions import Action, Dequeue
from orchestrator.engine.subagents import answer_parent
from orchestrator.events import Outbox
from orchestrator.store.tables import Conversation, Turn, utcnow
from schemas import ConversationState, EventName, TurnStatus


def move_cursor(session: Session, conv: Conversation, **values: Any) -> bool:
    """``UPDATE … WHERE version = :v``: True for exactly one of any racing copies.

    A move is progress: the stall clock restarts, the sweeper's re-dispatch
    count and any deferral of the old position are cleared.
    """
    values = {"redispatches": 0, "due_at": None, **values}
    result = session.execute(
        update(Conversation)
        .where(col(Conversation.id) == conv.id, col(Conversation.version) == conv.version)
        .values(version=conv.version + 1, progress_at=utcnow(), **values)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def move_cursor_from(
    session: Session,
    conversation_id: str,
    position: tuple[str, int, int],
    *where: ColumnElement[bool],
    **values: Any,
) -> bool:
    """Move the cursor of a running conversation that is still at
    ``position`` (turn, step, segment) and matches ``where``: a
    compare-and-set on the position itself, in one update (no read first).
    Of racing copies exactly one moves it: the others' update finds the
    position gone once the winner commits."""
    turn_id, step, segment = position
    values = {"redispatches": 0, "due_at": None, **values}
    result = session.execute(
        update(Conversation)
        .where(
            col(Conversation.id) == conversation_id,
            col(Conversation.state) == ConversationState.RUNNING.value,
            col(Conversation.turn_id) == turn_id,
            col(Conversation.cursor_step) == step,
            col(Conversation.cursor_segment) == segment,
            *where,
        )
        .values(version=col(Conversation.version) + 1, progress_at=utcnow(), **values)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


_END_EVENTS = {
    TurnStatus.COMPLETED: EventName.TURN_COMPLETED,
    TurnStatus.FAILED: EventName.TURN_FAILED,
    TurnStatus.CANCELLED: EventName.TURN_CANCELLED,
}


def finish_turn(
    session: Session,
    outbox: Outbox,
    conv: Conversation,
    turn: Turn,
    status: TurnStatus,
    *,
    output: str | None = None,
    error: str | None = None,
    notify_parent: bool = True,
    **values: Any,
) -> list[Action] | None:
    """End the turn and free the conversation; None if another copy moved first.

    Returns what runs next: a subagent's turn answers its parent's call and
    advances the parent (unless ``notify_parent`` is False, as when the
    whole tree is cancelled); a top-level turn lets the conversation's next
    queued message start. ``values`` are further conversation columns to
    set in the same update.
    """
    if not move_cursor(
        session,
        conv,
        state=ConversationState.IDLE.value,
        cursor_segment=-1,
        lease_owner=None,
        lease_until=None,
        **values,
    ):
        return None
    turn.status = status.value
    turn.output = output
    turn.error = error
    turn.finished_at = utcnow()
    session.add(turn)
    data: dict[str, Any] = {"status": status.value}
    if output is not None:
        data["output"] = output
    if error is not None:
        data["error"] = error
    outbox.record(
        _END_EVENTS[status],
        conv,
        turn,
        step=turn.steps,
        **data,
    )
    if turn.parent_call_id is None:
        return [Dequeue(conv.id)]
    if not notify_parent:
        return []
    return answer_parent(session, outbox, turn, status, output if output is not None else error)


def is_current(conv: Conversation | None, turn_id: str, step: int, segment: int) -> bool:
    """Does the cursor still point here? A stale task leaves quietly."""
    return (
        conv is not None
        and conv.state == ConversationState.RUNNING.value
        and conv.turn_id == turn_id
        and conv.cursor_step == step
        and conv.cursor_segment == segment
    )
