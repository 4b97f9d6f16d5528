"""The operations both clients run, as functions of a runtime.

:class:`~orchestrator.client.Client` calls them directly;
:class:`~orchestrator.async_client.AsyncClient` runs the same functions on
its async drivers (psycopg's async connections, ``redis.asyncio``) through
SQLAlchemy's greenlet bridge, so the engine's transactions, statements and
checks are written once. Each returns what the caller then sends to the
fleet (engine actions), never sends it itself.
"""

from __future__ import annotations

from typing import Any

from sqlmodel import select

from orchestrator import client_args as args
from orchestrator import published
from orchestrator.engine import approvals, conversations, inbox
from orchestrator.engine.actions import Action, TakeCheckpoint
from orchestrator.engine.cancel import cancel
from orchestrator.engine.history import load_history
from orchestrator.engine.tool_outputs import archived
from orchestrator.engine.turns import JobRef, start_turn
from orchestrator.errors import ConversationNotFound, InvalidRequestError, ToolOutputNotFound
from orchestrator.events import committed_horizon, snapshot_bound
from orchestrator.job_reads import HeldDeltas, stored_events
from orchestrator.runtime import Runtime
from orchestrator.store.tables import Conversation, Turn
from schemas import (
    Decision,
    Event,
    JobRequest,
    Message,
    MessageOptions,
    PendingApproval,
    TodoItem,
    Usage,
)
from schemas.jobs import DEFAULT_PRIORITY


def submit(rt: Runtime, request: JobRequest) -> tuple[JobRef, list[Action]]:
    """Start the turn (see ``Client.submit``); an agent named but not
    declared here is validated against what the workers published."""
    published.learn_if_needed(rt, request.agent)
    return start_turn(rt, request)


def job(rt: Runtime, job_id: str) -> JobRef:
    """The job of that id (else :class:`InvalidRequestError`)."""
    with rt.session() as session:
        turn = session.get(Turn, args.valid_id(job_id, "job_id"))
        if turn is None:
            raise InvalidRequestError(f"no job {job_id!r}", ["job_id"])
        return JobRef(turn.id, turn.conversation_id, turn.root_id)


def send(
    rt: Runtime, conversation_id: str, text: str, options: MessageOptions
) -> tuple[str, list[Action]]:
    """Send a message (see ``Client.send``): its queue entry and the actions."""
    return inbox.send(rt, args.conversation(conversation_id), text, options)


def job_for_message(rt: Runtime, conversation_id: str, entry_id: str) -> JobRef | None:
    """The job a sent message started, or None while it still waits."""
    key = inbox.idempotency_key(
        args.conversation(conversation_id), args.valid_id(entry_id, "entry_id")
    )
    with rt.session() as session:
        turn = session.exec(select(Turn).where(Turn.idempotency_key == key)).first()
        return JobRef(turn.id, turn.conversation_id, turn.root_id) if turn else None


def clear_queue(rt: Runtime, conversation_id: str) -> int:
    """Drop the conversation's queued messages; how many."""
    return inbox.clear(rt, args.conversation(conversation_id))


def stop(rt: Runtime, job_id: str) -> tuple[list[str], list[Action]]:
    """Cancel a job's tree (see ``Client.cancel``): the tasks to revoke and the actions."""
    return cancel(rt, args.valid_id(job_id, "job_id"))


def checkpoint(rt: Runtime, conversation_id: str) -> list[Action]:
    """The checkpoint task of an existing conversation."""
    _conversation(rt, conversation_id)
    return [TakeCheckpoint(conversation_id, DEFAULT_PRIORITY)]


def fork(rt: Runtime, conversation_id: str, tenant: str | None = None) -> str:
    """A copy of the conversation's messages (``tenant``'s); the new conversation's id."""
    return conversations.fork(rt, args.conversation(conversation_id), args.valid_tenant(tenant))


def clear(rt: Runtime, conversation_id: str) -> int:
    """Delete the conversation's messages and plan; how many messages."""
    return conversations.clear(rt, args.conversation(conversation_id))


def load(rt: Runtime, conversation_id: str, messages: list[Message] | list[dict[str, Any]]) -> int:
    """Replace the conversation's history with ``messages``."""
    return conversations.load(rt, args.conversation(conversation_id), messages)


def _conversation(rt: Runtime, conversation_id: str) -> Conversation:
    with rt.session() as session:
        conv = session.get(Conversation, args.conversation(conversation_id))
        if conv is None:
            raise ConversationNotFound(conversation_id)
        return conv


def usage(rt: Runtime, conversation_id: str) -> Usage:
    """Tokens and cost of every model call of the conversation."""
    conv = _conversation(rt, conversation_id)
    return Usage(
        input_tokens=conv.input_tokens, output_tokens=conv.output_tokens, cost_usd=conv.cost_usd
    )


def plan(rt: Runtime, conversation_id: str) -> list[TodoItem]:
    """The conversation's plan (empty before its first)."""
    conv = _conversation(rt, conversation_id)
    return [TodoItem.model_validate(item) for item in conv.plan or []]


def history(rt: Runtime, conversation_id: str) -> list[Message]:
    """Every stored message of the conversation, oldest first."""
    with rt.session() as session:
        if session.get(Conversation, args.conversation(conversation_id)) is None:
            raise ConversationNotFound(conversation_id)
        return load_history(session, conversation_id)


def tool_output(rt: Runtime, conversation_id: str, handle: str) -> Any:
    """The whole archived result of a tool call of the conversation's tree."""
    handle = args.valid_id(handle, "handle")
    with rt.session() as session:
        conv = session.get(Conversation, args.conversation(conversation_id))
        if conv is None:
            raise ConversationNotFound(conversation_id)
        try:
            return archived(session, conv.root_id, handle)
        except LookupError:
            raise ToolOutputNotFound(handle) from None


def answer(
    rt: Runtime, call_id: str, decision: Decision, by: str | None, text: str | None
) -> list[Action]:
    """Record a person's one answer to a waiting call (see ``Client.approve``
    and ``Client.deny``); the actions to send once it committed."""
    return approvals.answer(rt, args.valid_id(call_id, "call_id"), decision, by, text)


def pending_approvals(
    rt: Runtime,
    conversation_id: str | None,
    agent: str | None,
    tool: str | None,
    tenant: str | None,
) -> list[PendingApproval]:
    """The calls waiting for an answer, oldest first, by the filters given."""
    conversation_id, agent, tool, tenant = (
        None if value is None else args.valid_id(value, field)
        for value, field in (
            (conversation_id, "conversation_id"),
            (agent, "agent"),
            (tool, "tool"),
            (tenant, "tenant"),
        )
    )
    with rt.session() as session:
        return approvals.pending(session, conversation_id, agent, tool, tenant=tenant)


def follow_start(rt: Runtime, job_id: str, deltas: bool) -> tuple[str, HeldDeltas]:
    """A follower's start, once subscribed to the live stream: the turn's
    correlation id, and the deltas it will hold (whatever commits later is
    announced live)."""
    with rt.session() as session:
        turn = session.get(Turn, job_id)
        assert turn is not None
        return turn.correlation_id, HeldDeltas(committed_horizon(session) if deltas else None)


def stored(
    rt: Runtime, root_id: str, correlation_id: str, after: int, held: HeldDeltas
) -> list[Event]:
    """:func:`~orchestrator.job_reads.stored_events` in a session of ``rt``."""
    with rt.session() as session:
        return stored_events(session, root_id, correlation_id, after, held)


def horizon(rt: Runtime) -> int | None:
    """:func:`~orchestrator.events.committed_horizon` now."""
    with rt.session() as session:
        return committed_horizon(session)


def bound(rt: Runtime) -> int:
    """:func:`~orchestrator.events.snapshot_bound` now."""
    with rt.session() as session:
        return snapshot_bound(session)
