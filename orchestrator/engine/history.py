"""Reading a conversation's stored messages as content-model messages.

A step's prompt costs what is new in it, not the whole history
(:func:`model_prompt`):

* only what the model will see is read: when the agent's context chain
  starts with the ``checkpoint`` transformer, messages from the latest
  checkpoint's boundary on (``id >= boundary``), the rest never leaves
  Postgres;
* a stored message is validated and converted once per worker process:
  messages are never changed once stored, so :data:`cache` keeps, by row id,
  the validated :class:`~schemas.Message`, its OpenAI-format messages and
  their compact JSON size. The step's query reads only ids for rows the
  cache holds and the content of newer ones;
* the prompt's size for the token estimate is the sum of the cached sizes,
  not a new serialization of the prefix.

Context transformers still get every loaded message and may drop or
replace any: a message they return unchanged (the same object) is sent in
its cached form, any other is converted anew.

Tool names are stored qualified and sent as their provider-legal aliases
(:mod:`orchestrator.toolnames`): the cached form uses
:func:`~orchestrator.toolnames.alias`, a pure function of the name; a
message naming a tool the step offers under another alias (a collision
resolved at step time) is converted anew with the step's mapping.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import Session

from orchestrator import context
from orchestrator.context import TransformContext
from orchestrator.engine.tool_outputs import holds_view
from orchestrator.llm.call import openai_messages, system_message
from orchestrator.ratelimit import json_chars
from orchestrator.store.db import Db
from orchestrator.store.history_sql import (
    checkpoint_summary,
    message_contents,
    message_rows,
    stored_messages,
)
from orchestrator.store.history_sql import latest_checkpoint as checkpoint_row
from orchestrator.store.tables import MessageRow
from orchestrator.tools.names import alias
from schemas import AgentSpec, Message, Role, Usage, content_blocks_adapter


def row_to_message(row: MessageRow) -> Message:
    return _message(row.role, row.content, row.input_tokens, row.output_tokens, row.cost_usd)


def _message(
    role: str,
    content: list[dict[str, Any]],
    input_tokens: int | None,
    output_tokens: int | None,
    cost_usd: float | None,
) -> Message:
    usage = None
    if input_tokens is not None:
        usage = Usage(
            input_tokens=input_tokens, output_tokens=output_tokens or 0, cost_usd=cost_usd or 0.0
        )
    return Message(
        role=Role(role), content=content_blocks_adapter.validate_python(content), usage=usage
    )


def load_history(session: Session, conversation_id: str) -> list[Message]:
    return [row_to_message(r) for r in load_rows(session, conversation_id)]


def load_rows(session: Session, conversation_id: str, after: int = 0) -> list[MessageRow]:
    """The conversation's stored messages with an id above ``after``, in order."""
    return message_rows(session, conversation_id, after)


@dataclass(frozen=True)
class CheckpointSummary:
    """What a step and the next checkpoint read of a conversation's latest one."""

    boundary_message_id: int
    summary: str


def latest_checkpoint(session: Session, conversation_id: str) -> CheckpointSummary | None:
    row = checkpoint_row(session, conversation_id)
    return None if row is None else CheckpointSummary(row[0], row[1])


# --- the per-process cache of stored messages -------------------------------


@dataclass(frozen=True)
class Stored:
    """One stored message, validated and converted once."""

    message: Message
    #: Its OpenAI-format messages (:func:`orchestrator.llm.call.openai_messages`).
    sent: tuple[dict[str, Any], ...]
    #: Characters they take in the request's compact JSON, a comma after each.
    chars: int
    #: Whether it holds a cut tool output's view
    #: (:func:`~orchestrator.engine.tool_outputs.holds_view`).
    cut: bool = False


def _stored(message: Message, names: Mapping[str, str] | None = None) -> Stored:
    sent = tuple(
        openai_messages(message, lambda tool: names.get(tool) or alias(tool))
        if names
        else openai_messages(message)
    )
    return Stored(message, sent, sum(json_chars(m) + 1 for m in sent), holds_view(message))


def _names_tool(message: Message, tools: Mapping[str, str]) -> bool:
    """Does ``message`` call, or hold a result of, one of ``tools``?"""
    return any(getattr(block, "tool", None) in tools for block in message.content)


class MessageCache:
    """Stored messages by conversation and row id, least recently used
    first out past ``max_chars`` of JSON; thread-safe.

    An entry is found only with the row's ``created_at`` too: on SQLite a
    deleted row's id can be used again (``clear``, ``load``). The newest row
    id cached per conversation tells the step's query which contents to read.
    """

    def __init__(self, max_chars: int, max_conversations: int = 10_000) -> None:
        self.max_chars = max_chars
        self.max_conversations = max_conversations
        self.chars = 0
        self._entries: OrderedDict[tuple[str, int], tuple[datetime, Stored]] = OrderedDict()
        self._newest: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def newest(self, conversation_id: str) -> int:
        """The highest row id of the conversation cached so far (0: none)."""
        with self._lock:
            return self._newest.get(conversation_id, 0)

    def get(self, conversation_id: str, rows: Sequence[tuple[int, datetime]]) -> dict[int, Stored]:
        """The entries of ``rows`` (id, created_at) held, by id."""
        found = {}
        with self._lock:
            for row_id, created in rows:
                held = self._entries.get((conversation_id, row_id))
                if held is not None and held[0] == created:
                    self._entries.move_to_end((conversation_id, row_id))
                    found[row_id] = held[1]
        return found

    def put(self, conversation_id: str, entries: dict[int, tuple[datetime, Stored]]) -> None:
        if not entries:
            return
        with self._lock:
            for row_id, held in entries.items():
                old = self._entries.pop((conversation_id, row_id), None)
                self.chars += held[1].chars - (old[1].chars if old else 0)
                self._entries[(conversation_id, row_id)] = held
            while self.chars > self.max_chars and self._entries:
                self.chars -= self._entries.popitem(last=False)[1][1].chars
            newest = max(self._newest.pop(conversation_id, 0), *entries)
            self._newest[conversation_id] = newest
            while len(self._newest) > self.max_conversations:
                self._newest.popitem(last=False)


#: This process's cache: 64 MB of message JSON.
cache = MessageCache(max_chars=64_000_000)


def _load_stored(
    db: Db, conversation_id: str, skip: bool
) -> tuple[int | None, list[tuple[int, Stored]]]:
    """The boundary message id of the conversation's latest checkpoint (None:
    none, or no message read), and its messages in order, only from that
    boundary on if ``skip``: content is read only for rows newer than the
    cache's newest, and for any older one it does not hold (evicted, or
    committed late)."""
    newest = cache.newest(conversation_id)
    rows = stored_messages(db, conversation_id, skip, newest)
    known = cache.get(conversation_id, [(row[0], row[1]) for row in rows])
    contents: dict[int, list[dict[str, Any]]] = {r[0]: r[6] for r in rows if r[6] is not None}
    missing = [row[0] for row in rows if row[0] not in known and row[0] not in contents]
    if missing:
        for row_id, content in message_contents(db, missing):
            contents[row_id] = content
    new = {
        row_id: (created, _stored(_message(role, contents[row_id], tokens_in, tokens_out, cost)))
        for row_id, created, role, tokens_in, tokens_out, cost, _, _ in rows
        if row_id not in known
    }
    cache.put(conversation_id, new)
    loaded = [(row[0], known[row[0]] if row[0] in known else new[row[0]][1]) for row in rows]
    return (rows[0][7] if rows else None), loaded


# --- what the model sees ------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """A step's messages in OpenAI format, with their compact JSON size."""

    messages: list[dict[str, Any]]
    #: ``len(json.dumps(messages, separators=(",", ":")))``, from cached sizes.
    chars: int
    #: Whether a message holds a cut tool output's view (``read_tool_output`` is offered).
    cut: bool = False


def _context(db: Db, conversation_id: str, agent: AgentSpec) -> tuple[list[Message], list[Stored]]:
    # Only the checkpoint transformer looks at what precedes the boundary:
    # when it runs first, nothing before the boundary is loaded.
    skip = agent.context[:1] == ("checkpoint",)
    boundary_id, loaded = _load_stored(db, conversation_id, skip)
    if skip and (not loaded or (boundary_id is not None and loaded[0][0] != boundary_id)):
        # the boundary is not this conversation's (as before: no summary)
        boundary_id, loaded = _load_stored(db, conversation_id, False)
    ids = [row_id for row_id, _ in loaded]
    boundary = ids.index(boundary_id) if boundary_id in ids else None
    summary = None
    if boundary_id is not None:  # a second statement only for a conversation with a checkpoint
        summary = checkpoint_summary(db, conversation_id, boundary_id)
    ctx = TransformContext(agent=agent, boundary=boundary, summary=summary)
    stored = [entry for _, entry in loaded]
    return context.apply([entry.message for entry in stored], ctx), stored


def model_context(db: Db, conversation_id: str, agent: AgentSpec) -> list[Message]:
    """The history the model sees: stored messages through the agent's transformers."""
    return _context(db, conversation_id, agent)[0]


def model_prompt(
    db: Db,
    conversation_id: str,
    agent: AgentSpec,
    system: str,
    names: Mapping[str, str] | None = None,
) -> Prompt:
    """The messages of the model request: ``system`` and :func:`model_context`,
    in OpenAI format (:func:`orchestrator.llm.call.to_openai_messages`).
    ``names``: the step's qualified name → alias of the tools it offers
    (:func:`orchestrator.toolnames.aliases`); other names are sent as
    their :func:`~orchestrator.toolnames.alias`.

    The dicts of stored messages are shared with the cache: the model
    client must not change them.
    """
    history, stored = _context(db, conversation_id, agent)
    renamed = {q: a for q, a in (names or {}).items() if a != alias(q)}
    by_object = {id(entry.message): entry for entry in stored}
    messages = system_message(system)
    chars = 1 + sum(json_chars(m) + 1 for m in messages)  # "[", and "]" for the last ","
    cut = False
    for message in history:
        entry = by_object.get(id(message))
        if renamed and _names_tool(message, renamed):
            entry = _stored(message, renamed)
        elif entry is None or entry.message is not message:
            entry = _stored(message)
        messages.extend(entry.sent)
        chars += entry.chars
        cut = cut or entry.cut
    return Prompt(messages, chars if messages else 2, cut)
