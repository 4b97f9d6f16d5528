"""What a conversation's inbox reads from Postgres
(:mod:`orchestrator.engine.inbox`): what a dequeue starts a turn with,
which conversations are idle, and the recorded history of queued messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlmodel import Session, col

from orchestrator.store.statements import run
from orchestrator.store.tables import Conversation, EventRow, Turn, table
from schemas import ConversationState, EventName

_CONVERSATIONS = table(Conversation)
_EVENTS = table(EventRow)
_LAST = table(Turn).alias("last_turn")
_JOB = table(Turn).alias("last_job")

#: The conversation, and what its last job (the job of its latest turn) ran with.
_STATE = (
    select(
        _CONVERSATIONS.c.state,
        _CONVERSATIONS.c.agent_spec,
        _CONVERSATIONS.c.priority,
        _JOB.c.context_data,
        _JOB.c.budget,
    )
    .select_from(
        _CONVERSATIONS.outerjoin(_LAST, _LAST.c.id == _CONVERSATIONS.c.turn_id).outerjoin(
            _JOB, _JOB.c.id == func.coalesce(_LAST.c.job_id, _LAST.c.id)
        )
    )
    .where(_CONVERSATIONS.c.id == bindparam("id"))
)

_INBOX_EVENTS = (
    EventName.MESSAGE_QUEUED.value,
    EventName.MESSAGE_DEQUEUED.value,
    EventName.QUEUE_CLEARED.value,
)


def dequeue_state(session: Session, conversation_id: str) -> Any:
    """The conversation's state, agent spec and priority, and its last
    job's context data and budget; None if there is no such conversation."""
    return run(session, _STATE, {"id": conversation_id}).first()


def idle_among(session: Session, conversation_ids: Sequence[str]) -> Sequence[str]:
    """Those of ``conversation_ids`` that are idle."""
    ids = col(Conversation.id)
    return (
        session.execute(
            select(ids).where(
                ids.in_(conversation_ids), col(Conversation.state) == ConversationState.IDLE.value
            )
        )
        .scalars()
        .all()
    )


def inbox_events(session: Session) -> Sequence[Any]:
    """Every message queued, dequeued or cleared (conversation id, event
    name, data), in each tree's order."""
    return session.execute(
        select(_EVENTS.c.conversation_id, _EVENTS.c.name, _EVENTS.c.data)
        .where(_EVENTS.c.name.in_(_INBOX_EVENTS))
        .order_by(_EVENTS.c.root_id, _EVENTS.c.seq)
    ).all()
