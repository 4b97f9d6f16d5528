"""The conversation cursor: compare-and-set moves and turn endings."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session

from orchestrator import tracing
from orchestrator.engine.actions import Action, Dequeue
from orchestrator.engine.subagents import answer_parent
from orchestrator.events import Outbox
from orchestrator.store.cursor_sql import move_by_version, progress
from orchestrator.store.tables import Conversation, Turn, utcnow
from schemas import ConversationState, EventName, TurnStatus


def move_cursor(session: Session, conv: Conversation, **values: Any) -> bool:
    """``UPDATE … WHERE version = :v``: True for exactly one of any racing copies.

    A move is progress: the stall clock restarts, the sweeper's re-dispatch
    count, any deferral of the old position and its retry count are cleared. ``values`` are
    plain values (no SQL expressions); ``conv`` shows them once moved.
    """
    return _move(session, conv, values)


def _move(
    session: Session,
    conv: Conversation,
    values: dict[str, Any],
    ending: tuple[str, dict[str, Any]] | None = None,
) -> bool:
    """:func:`move_cursor`; with ``ending`` (a turn's id and the columns
    that end it), the turn is ended too, only if the cursor moved
    (:func:`~orchestrator.store.cursor_sql.move_by_version`)."""
    values = progress(values)
    if not move_by_version(session, (conv.id, conv.version), values, ending):
        return False
    for key, value in (*values.items(), ("version", conv.version + 1)):
        set_committed_value(conv, key, value)
    return True


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
    moved = {
        "state": ConversationState.IDLE.value,
        "cursor_segment": -1,
        "lease_owner": None,
        "lease_until": None,
        **values,
    }
    ended = {"status": status.value, "output": output, "error": error, "finished_at": utcnow()}
    answers = turn.parent_call_id is not None and notify_parent
    # a turn that answers its parent is ended now, with the move, where the
    # answer's flush wrote it; any other with the transaction's other changes
    if not _move(session, conv, moved, (turn.id, ended) if answers else None):
        return None
    if answers:
        for key, value in ended.items():
            set_committed_value(turn, key, value)
    else:
        for key, value in ended.items():
            setattr(turn, key, value)
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
    tracing.turn_ended(turn, status.value)
    if turn.parent_call_id is None:
        return [Dequeue(conv.id, if_waiting=True)]
    if not answers:
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
