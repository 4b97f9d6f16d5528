"""Queued messages: a Redis Stream per conversation, drained one turn at a time.

``send`` appends the message to the conversation's stream and asks for a
dequeue. ``dequeue`` starts a turn for the oldest message when the
conversation is idle; every turn's end asks for one again (a step's end
only if the inbox holds a message: :mod:`orchestrator.engine.after_commit`). The turn's
idempotency key is the stream entry's id and the entry is deleted only
after that turn is stored, so a worker dying between the two costs
nothing: the next dequeue finds the turn already there, deletes the entry
and moves on. Neither a send racing the end of a turn nor two concurrent
dequeues can lose or double a message (the conversation's compare-and-set
lets one turn start at a time).

The conversations whose inbox may hold messages are kept in a Redis Set,
so the sweeper finds an idle conversation with a waiting message whose
dequeue was lost (:func:`waiting_inboxes`). Every queued message is also
recorded in Postgres (``message.queued``, ``message.dequeued``,
``queue.cleared``): when Redis comes back without its data, the sweeper
rebuilds the inboxes from those records. A rebuilt entry keeps its
original entry id in its ``entry`` field, so its turn's idempotency key is
unchanged and it can never start a second turn.

A queued message's turn inherits the conversation's last job's
``context_data``, budget and priority, each unless the send gave its own
(:class:`~schemas.MessageOptions`, kept in the entry's ``options`` field
and in ``message.queued``); the last job is read when the turn starts.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from typing import Any

from sqlmodel import Session

from orchestrator.engine.actions import Action, Dequeue
from orchestrator.engine.turns import check_input, check_job_data, start_turn
from orchestrator.errors import (
    ChorusError,
    ConversationBusyError,
    ConversationNotFound,
)
from orchestrator.keys import inbox, inboxes, inboxes_restored
from orchestrator.runtime import Runtime
from orchestrator.store.inbox_sql import dequeue_state, idle_among, inbox_events
from orchestrator.store.tables import Conversation, Turn
from schemas import AgentSpec, Budget, ConversationState, EventName, JobRequest, MessageOptions

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


#: Field of an inbox entry holding its :class:`~schemas.MessageOptions` as JSON.
OPTIONS = "options"


def send(
    rt: Runtime, conversation_id: str, text: str, options: MessageOptions | None = None
) -> tuple[str, list[Action]]:
    """Queue ``text`` for the conversation; returns the entry id and the
    dequeue to dispatch (which starts it at once if the conversation is idle).
    ``options`` overrides what the turn would inherit from the
    conversation's last job.

    Everything that can refuse the message is checked before it enters the
    stream; its ``message.queued`` event commits with the entry, and the
    entry is taken back if that commit fails, so a failed send leaves no
    message behind to run later.
    """
    check_input(rt.settings, text, "text")
    given = options.model_dump(mode="json", exclude_none=True) if options else {}
    if options is not None:
        check_job_data(options.context_data, options.budget)
    key = inbox(rt.settings.redis_prefix, conversation_id)
    entry: str | None = None
    try:
        with rt.transaction() as (session, outbox):
            conv, turn = _conversation(session, conversation_id)
            entry = _enqueue(rt, conversation_id, _fields(text, given))
            outbox.record(EventName.MESSAGE_QUEUED, conv, turn, entry=entry, text=text, **given)
    except BaseException:
        if entry is not None:
            rt.redis.xdel(key, entry)
        raise
    return entry, [Dequeue(conversation_id)]


def _fields(text: str, options: dict[str, Any]) -> dict[str, str]:
    """An inbox entry's fields: the text, and the send's options if any."""
    return {"text": text, OPTIONS: json.dumps(options)} if options else {"text": text}


def clear(rt: Runtime, conversation_id: str) -> int:
    """Drop every queued message of the conversation; returns how many."""
    key = inbox(rt.settings.redis_prefix, conversation_id)
    pipe = rt.redis.pipeline()
    pipe.xlen(key)
    pipe.delete(key)
    with rt.transaction() as (session, outbox):
        conv, turn = _conversation(session, conversation_id)
        count = int(pipe.execute()[0])
        _forget(rt, conversation_id)
        outbox.record(EventName.QUEUE_CLEARED, conv, turn, count=count)
    return count


def dequeue(rt: Runtime, conversation_id: str) -> list[Action]:
    """Start a turn for the oldest queued message if the conversation is idle."""
    key = inbox(rt.settings.redis_prefix, conversation_id)
    while True:
        entries: Any = rt.redis.xrange(key, count=1)
        if not entries:
            _forget(rt, conversation_id)
            return []
        entry_id, fields = entries[0]
        original = fields.get("entry", entry_id)  # a rebuilt entry keeps its first id
        with rt.session() as session:
            conv = dequeue_state(session, conversation_id)
        if conv is None:
            rt.redis.delete(key)
            _forget(rt, conversation_id)
            return []
        if conv.state != ConversationState.IDLE.value:
            return []  # the running turn's end dequeues again
        given = MessageOptions.model_validate_json(fields.get(OPTIONS) or "{}")
        budget = given.budget or (Budget.model_validate(conv.budget) if conv.budget else None)
        request = JobRequest(
            agent=AgentSpec.model_validate(conv.agent_spec),
            input=fields["text"],
            conversation_id=conversation_id,
            idempotency_key=idempotency_key(conversation_id, original),
            context_data=given.context_data
            if given.context_data is not None
            else conv.context_data or {},
            budget=budget,
            priority=conv.priority if given.priority is None else given.priority,
        )
        try:
            _ref, actions = start_turn(rt, request, queued_entry=original)
        except ConversationBusyError:
            return []  # another dequeue started a turn first
        except ChorusError:
            log.exception("queued message %s cannot start a turn; dropped", entry_id)
            actions = []
        rt.redis.xdel(key, entry_id)
        if actions:
            return actions


def _enqueue(rt: Runtime, conversation_id: str, fields: dict[str, str]) -> str:
    """Append to the conversation's stream and mark its inbox as waiting,
    in one MULTI: no message is ever queued outside the set, nor in a
    stream set to expire (:func:`_forget`). Returns the entry id."""
    prefix = rt.settings.redis_prefix
    key = inbox(prefix, conversation_id)
    pipe = rt.redis.pipeline()
    pipe.xadd(key, fields)  # type: ignore[arg-type]
    pipe.sadd(inboxes(prefix), conversation_id)
    pipe.persist(key)
    return str(pipe.execute()[0])


def _forget(rt: Runtime, conversation_id: str) -> None:
    """Take the conversation out of the set of inboxes, unless a message
    arrived meanwhile (:func:`_enqueue` adds to the stream and the set at
    once, so it is either seen by the length check or adds itself back).
    The removal and the check go in one MULTI: one round trip, and nothing
    runs between them.

    The empty stream is set to expire ``event_stream_ttl`` seconds later
    (emptied streams stayed in Redis forever, one per conversation ever
    sent to); a message queued meanwhile takes the expiry off again, here
    or in its own MULTI. Its entry ids stay above the old ones: a new
    stream's ids are Redis's clock, an hour past the last."""
    prefix = rt.settings.redis_prefix
    key = inbox(prefix, conversation_id)
    pipe = rt.redis.pipeline()
    pipe.srem(inboxes(prefix), conversation_id)
    pipe.xlen(key)
    pipe.expire(key, rt.settings.event_stream_ttl)
    if pipe.execute()[1]:
        back = rt.redis.pipeline()
        back.sadd(inboxes(prefix), conversation_id)
        back.persist(key)
        back.execute()


def _entry_ms(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def waiting_inboxes(rt: Runtime, stall: float, limit: int) -> list[Action]:
    """A dequeue for each idle conversation whose oldest queued message has
    waited longer than ``stall`` seconds (its own dequeue was lost)."""
    prefix = rt.settings.redis_prefix
    if not rt.redis.exists(inboxes_restored(prefix)):
        restore_inboxes(rt)
    seconds, micros = rt.redis.time()  # stream ids are stamped with Redis's clock
    cutoff = int((seconds + micros / 1e6 - stall) * 1000)
    waiting: list[str] = []
    # A random sample: with more than ``limit`` inboxes, every one is reached in time.
    sample: Any = rt.redis.srandmember(inboxes(prefix), limit)
    for conversation_id in sample:
        oldest: Any = rt.redis.xrange(inbox(prefix, conversation_id), count=1)
        if not oldest:
            _forget(rt, conversation_id)
        elif _entry_ms(oldest[0][0]) < cutoff:
            waiting.append(conversation_id)
    if not waiting:
        return []
    with rt.session() as session:
        idle = idle_among(session, waiting)
    return [Dequeue(conversation_id) for conversation_id in idle]


def restore_inboxes(rt: Runtime) -> int:
    """Re-queue every message recorded as queued in Postgres and neither
    dequeued nor cleared since, that its inbox no longer holds (Redis lost
    its data). Returns how many were re-queued."""
    with rt.session() as session:
        rows = inbox_events(session)
    pending: dict[str, dict[str, dict[str, str]]] = defaultdict(dict)
    for conversation_id, name, data in rows:
        if name == EventName.QUEUE_CLEARED.value:
            pending[conversation_id].clear()
        elif name == EventName.MESSAGE_QUEUED.value:
            given = {k: v for k, v in data.items() if k in MessageOptions.model_fields}
            pending[conversation_id][data["entry"]] = _fields(data["text"], given)
        else:
            pending[conversation_id].pop(data.get("entry", ""), None)
    prefix = rt.settings.redis_prefix
    restored = 0
    for conversation_id, entries in pending.items():
        key = inbox(prefix, conversation_id)
        for entry in sorted(entries, key=lambda e: tuple(int(p) for p in e.split("-"))):
            if rt.redis.xrange(key, entry, entry):
                continue  # still there: Redis kept its data
            _enqueue(rt, conversation_id, {**entries[entry], "entry": entry})
            restored += 1
    rt.redis.set(inboxes_restored(prefix), "1")
    if restored:
        log.warning("re-queued %d messages recorded in Postgres but missing in Redis", restored)
    return restored
