"""Starting a conversation: a new root (a submitted job's), a child (a
subagent's, a checkpoint's summarizer) or a copy (a fork), written one way;
and the job an idempotency key already started.

A new conversation is built from values (:func:`new_conversation`,
:func:`first_turn`, :func:`first_message`) and inserted by
:func:`start_conversation` with statements built once: no entity is made,
as nothing reads the rows back in the transaction that writes them. A
guard (a subagent's fan-out slot) can decide whether it is written at all;
where one statement can write several tables (Postgres), the guard, the
rows and their events are then one statement.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Insert, Update, bindparam, insert, select
from sqlmodel import Session, SQLModel

from orchestrator.events import Outbox
from orchestrator.store.dialect import writes_in_ctes
from orchestrator.store.rows import AnyConversation, ConversationRow, TurnRow
from orchestrator.store.statements import (
    NewRow,
    Riders,
    filled,
    insert_new,
    new_row_params,
    new_rows_if,
    run,
)
from orchestrator.store.tables import Conversation, MessageRow, Turn, new_id, table, utcnow
from schemas import TextBlock


class NewConversation(NamedTuple):
    """A conversation to start: its row's values, and its first turn's and
    first message's, if it has them (every column filled: :func:`filled`)."""

    conversation: dict[str, Any]
    turn: dict[str, Any] | None = None
    message: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return str(self.conversation["id"])

    @property
    def row(self) -> ConversationRow:
        """The conversation as the named operations read it."""
        return ConversationRow._make(self.conversation[key] for key in ConversationRow._fields)

    @property
    def turn_row(self) -> TurnRow:
        """Its first turn as the named operations read it."""
        assert self.turn is not None
        return TurnRow._make(self.turn[key] for key in TurnRow._fields)

    def rows(self) -> tuple[NewRow, ...]:
        """The rows to insert, in order."""
        found: list[NewRow] = [(Conversation, self.conversation)]
        if self.turn is not None:
            found.append((Turn, self.turn))
        if self.message is not None:
            found.append((MessageRow, self.message))
        return tuple(found)


def new_conversation(
    parent: AnyConversation | None, agent_spec: dict[str, Any], **values: Any
) -> dict[str, Any]:
    """The values of a new conversation of the agent ``agent_spec`` (a
    dumped :class:`~schemas.AgentSpec`): a child of ``parent`` (its root,
    one level deeper), or a new root (``parent`` None). ``values``: further
    columns (``kind``, ``state``, ``priority`` ...)."""
    conversation_id = new_id()
    row: dict[str, Any] = {
        "id": conversation_id,
        "root_id": conversation_id,
        "agent": agent_spec["name"],
        "agent_spec": agent_spec,
    }
    if parent is not None:
        row.update(root_id=parent.root_id, parent_id=parent.id, depth=parent.depth + 1)
    row.update(values)
    return filled(Conversation, row)


def first_turn(conversation: Mapping[str, Any], text: str, **values: Any) -> dict[str, Any]:
    """The values of the first turn of ``conversation`` (new), whose input
    is ``text``; ``values``: further columns (its job, context, ...)."""
    row = {
        "id": conversation["turn_id"],
        "conversation_id": conversation["id"],
        "root_id": conversation["root_id"],
        "number": 0,
        "agent": conversation["agent"],
        "input_text": text,
        **values,
    }
    return filled(Turn, row)


def first_message(conversation_id: str, turn_id: str, text: str) -> dict[str, Any]:
    """The values of a new conversation's first message: the user's ``text``."""
    return filled(
        MessageRow,
        {
            "conversation_id": conversation_id,
            "turn_id": turn_id,
            "step": 0,
            "kind": "input",
            "role": "user",
            "content": [TextBlock(text=text).model_dump()],
        },
    )


_TURNS = table(Turn)
_BY_KEY = select(_TURNS.c.id, _TURNS.c.conversation_id, _TURNS.c.root_id).where(
    _TURNS.c.idempotency_key == bindparam("key")
)


def turn_by_key(session: Session, key: str) -> Any:
    """The id, conversation id and root id of the turn submitted with
    idempotency key ``key``, if there is one."""
    return run(session, _BY_KEY, {"key": key}).first()


#: A guard on a start: a conditional UPDATE built once, and its parameters.
Guard = tuple[Update, dict[str, Any]]


def start_conversation(
    session: Session,
    new: NewConversation,
    *,
    copy_from: str | None = None,
    guard: Guard | None = None,
    events: Outbox | None = None,
) -> bool:
    """Insert ``new``'s rows in the session's transaction; ``copy_from``:
    first copy the messages of that conversation (a fork: the copies come
    before the new first message, the history's order).

    With ``guard``, only if it changes a row (False if it does not: nothing
    is written, and ``events``' pending events are dropped). Where one
    statement can write several tables (Postgres) and nothing is copied,
    the guard, the rows and ``events``' pending events are one statement
    (:meth:`~orchestrator.events.Outbox.flush_if`): the guard's row is
    locked before any new row. Elsewhere the events stay pending, stored
    with the transaction."""
    rows = new.rows()
    if guard is not None:
        statement, params = guard
        if events is not None and copy_from is None and writes_in_ctes(session):
            models = tuple(model for model, _ in rows)
            together = {**params, **new_row_params(rows)}
            return events.flush_if(session, statement, together, _rows_if(models))
        if run(session, statement, params).rowcount != 1:
            if events is not None:
                events.discard()
            return False
    if copy_from is not None:
        run(session, _COPY, {"source_id": copy_from, "target_id": new.id, "now": utcnow()})
    insert_new(session, *rows)
    return True


@cache
def _rows_if(models: tuple[type[SQLModel], ...]) -> Riders:
    """The riders of a guarded start: a row of each of ``models``, each
    inserted only if the guard changed a row."""

    def riders(taken: ColumnElement[bool]) -> tuple[Insert, ...]:
        return tuple(new_rows_if(model, taken) for model in models)

    return riders


_MESSAGES = table(MessageRow)
_COPIED = [column for column in _MESSAGES.c if column.key != "id"]

#: Every message of ``source_id`` copied to ``target_id``, in order (the
#: copies' ids follow the originals'), each stamped ``now``.
_COPY = insert(_MESSAGES).from_select(
    [column.key for column in _COPIED],
    select(
        *(
            bindparam("target_id", type_=column.type).label(column.key)
            if column.key == "conversation_id"
            else bindparam("now", type_=column.type).label(column.key)
            if column.key == "created_at"
            else column
            for column in _COPIED
        )
    )
    .where(_MESSAGES.c.conversation_id == bindparam("source_id"))
    .order_by(_MESSAGES.c.id),
)
