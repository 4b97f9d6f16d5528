"""Queued messages: a Redis Stream per conversation, drained one turn at a time.

``send`` appends the message to the conversation's stream and asks for a
dequeue. ``dequeue`` starts a turn for the oldest message when the
conversation is idle; every turn's end asks for one again. The turn's
idempotency key is the stream entry's id and the entry is deleted only
after that turn is stored, so a worker dying between the two costs
nothing: the next dequeue finds the turn already there, deletes the entry
and moves on. Neither a send racing the end of a turn nor two concurrent
dequeues can lose or double a message (the conversation's compare-and-set
lets one turn start at a time).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlmodel import Session

from orchestrator.engine.actions import Action, Dequeue
from orchestrator.engine.turns import check_input, start_turn
from orchestrator.errors import (
    ChorusError,
    ConversationBusyError,
    ConversationNotFound,
)
from orchestrator.keys import inbox
from orchestrator.runtime import Runtime
from orchestrator.store.tables import Conversation, Turn
from schemas import AgentSpec, ConversationState, EventName, JobRequest

log = logging.getLogger(__name__)


def idempotency_key(conversation_id: str, entry_id: str) -> str:
    """The key of the turn a queued message starts."""
    return f"inbox:{conversation_id}:{entry_id}"


def _conversation(session: Session, conversation_id: str) -> tuple[Conversation, Turn | None]:
    """The conversation and its latest turn (None if it never ran one, as
    a fresh fork)."""
    conv = session.get(Conversation, conversation_id)
    if conv is None:
        raise ConversationNotFound(conversation_id)
    return conv, session.get(Turn, conv.turn_id) if conv.turn_id else None


def send(rt: Runtime, conversation_id: str, text: str) -> tuple[str, list[Action]]:
    """Queue ``text`` for the conversation; returns the entry id and the
    dequeue to dispatch (which starts it at once if the conversation is idle).

    Everything that can refuse the message is checked before it enters the
    stream; its ``message.queued`` event commits with the entry, and the
    entry is taken back if that commit fails, so a failed send leaves no
    message behind to run later.
    """
    check_input(rt.settings, text, "text")
    key = inbox(rt.settings.redis_prefix, conversation_id)
    entry: str | None = None
    try:
        with rt.transaction() as (session, outbox):
            conv, turn = _conversation(session, conversation_id)
            entry = str(rt.redis.xadd(key, {"text": text}))
            outbox.record(EventName.MESSAGE_QUEUED, conv, turn, entry=entry, text=text)
    except BaseException:
        if entry is not None:
            rt.redis.xdel(key, entry)
        raise
    return entry, [Dequeue(conversation_id)]


def clear(rt: Runtime, conversation_id: str) -> int:
    """Drop every queued message of the conversation; returns how many."""
    key = inbox(rt.settings.redis_prefix, conversation_id)
    pipe = rt.redis.pipeline()
    pipe.xlen(key)
    pipe.delete(key)
    with rt.transaction() as (session, outbox):
        conv, turn = _conversation(session, conversation_id)
        count = int(pipe.execute()[0])
        outbox.record(EventName.QUEUE_CLEARED, conv, turn, count=count)
    return count


def dequeue(rt: Runtime, conversation_id: str) -> list[Action]:
    """Start a turn for the oldest queued message if the conversation is idle."""
    key = inbox(rt.settings.redis_prefix, conversation_id)
    while True:
        entries: Any = rt.redis.xrange(key, count=1)
        if not entries:
            return []
        entry_id, fields = entries[0]
        with rt.session() as session:
            conv = session.get(Conversation, conversation_id)
        if conv is None:
            rt.redis.delete(key)
            return []
        if conv.state != ConversationState.IDLE.value:
            return []  # the running turn's end dequeues again
        request = JobRequest(
            agent=AgentSpec.model_validate(conv.agent_spec),
            input=fields["text"],
            conversation_id=conversation_id,
            idempotency_key=idempotency_key(conversation_id, entry_id),
        )
        try:
            _ref, actions = start_turn(rt, request, queued_entry=entry_id)
        except ConversationBusyError:
            return []  # another dequeue started a turn first
        except ChorusError:
            log.exception("queued message %s cannot start a turn; dropped", entry_id)
            actions = []
        rt.redis.xdel(key, entry_id)
        if actions:
            return actions
