"""Conversation operations: fork, clear, load. Each refuses while a turn runs."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlmodel import Session

from orchestrator.engine.cursor import move_cursor
from orchestrator.errors import (
    ConversationBusyError,
    ConversationNotFound,
    InvalidRequestError,
    invalid,
)
from orchestrator.runtime import Runtime
from orchestrator.store.conversation_sql import (
    NewConversation,
    new_conversation,
    start_conversation,
)
from orchestrator.store.history_sql import delete_messages
from orchestrator.store.tables import Conversation, MessageRow, new_id
from orchestrator.store.values import check
from schemas import ConversationState, Message

_messages: TypeAdapter[list[Message]] = TypeAdapter(list[Message])


def load_idle(session: Session, conversation_id: str) -> Conversation:
    """The conversation, if it exists and runs no turn."""
    conv = session.get(Conversation, conversation_id)
    if conv is None:
        raise ConversationNotFound(conversation_id)
    if conv.state != ConversationState.IDLE.value:
        raise ConversationBusyError(conversation_id)
    return conv


def _claim(session: Session, conv: Conversation, **values: Any) -> None:
    """Bump the version, so a turn starting meanwhile loses its compare-and-set
    (setting ``values`` on the conversation in the same update)."""
    if not move_cursor(session, conv, **values):
        raise ConversationBusyError(conv.id)


def fork(rt: Runtime, conversation_id: str, tenant: str | None = None) -> str:
    """A new root conversation with the same agent and a copy of the
    messages, belonging to ``tenant`` (stored with it)."""
    with rt.session() as session:
        conv = load_idle(session, conversation_id)
        copy = NewConversation(new_conversation(None, conv.agent_spec, tenant=tenant))
        start_conversation(session, copy, copy_from=conversation_id)
        _claim(session, conv)
        return copy.id


def clear(rt: Runtime, conversation_id: str) -> int:
    """Delete the conversation's messages and its plan (the plan is its
    agent's todo list for the work those messages hold); returns how many
    messages."""
    with rt.session() as session:
        conv = load_idle(session, conversation_id)
        _claim(session, conv, plan=None)
        return delete_messages(session, conversation_id)


def load(
    rt: Runtime, conversation_id: str, messages: list[Message] | list[dict[str, object]]
) -> int:
    """Replace the conversation's history with ``messages`` (validated), and
    drop its plan, as :func:`clear` does."""
    if not isinstance(messages, list | tuple):
        raise InvalidRequestError("messages: a list of messages is required", ["messages"])
    check(messages, "messages")
    raw = [m.model_dump() if isinstance(m, Message) else m for m in messages]
    try:
        checked = _messages.validate_python(raw)
    except ValidationError as exc:
        raise invalid(exc, "messages") from None
    with rt.session() as session:
        conv = load_idle(session, conversation_id)
        _claim(session, conv, plan=None)
        delete_messages(session, conversation_id)
        batch = f"load:{new_id()}"
        for index, message in enumerate(checked):
            session.add(
                MessageRow(
                    conversation_id=conversation_id,
                    turn_id=batch,
                    step=index,
                    kind="loaded",
                    role=message.role.value,
                    content=[b.model_dump(mode="json") for b in message.content],
                )
            )
        return len(checked)
