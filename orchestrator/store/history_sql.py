"""A conversation's history in SQL: its messages (read whole, read as a
step reads them, cleared), its latest checkpoint, and its plan (the
agent's todo list for the work those messages hold).

The statements a step runs are built once and executed with parameters
(``b_…``) through :mod:`orchestrator.store.fast_executor`: building them
per call and generating their cache keys cost more CPU than running them.
They return plain rows of the tables, no ORM entities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Boolean, bindparam, case, delete, select, update
from sqlmodel import Session, col

from orchestrator.store.db import Db, connection_of
from orchestrator.store.fast_executor import execute
from orchestrator.store.tables import CheckpointRow, Conversation, MessageRow, table

_CHECKPOINTS = table(CheckpointRow)
_MESSAGES = table(MessageRow)

_LATEST_CHECKPOINT = (
    select(_CHECKPOINTS.c.boundary_message_id, _CHECKPOINTS.c.summary)
    .where(_CHECKPOINTS.c.conversation_id == bindparam("b_conv"))
    .order_by(_CHECKPOINTS.c.id.desc())
    .limit(1)
)

#: The boundary message of the conversation's latest checkpoint (NULL: none).
_BOUNDARY = _LATEST_CHECKPOINT.with_only_columns(
    _CHECKPOINTS.c.boundary_message_id
).scalar_subquery()
#: The summary of its latest checkpoint with boundary ``b_boundary``.
_SUMMARY = (
    select(_CHECKPOINTS.c.summary)
    .where(
        _CHECKPOINTS.c.conversation_id == bindparam("b_conv"),
        _CHECKPOINTS.c.boundary_message_id == bindparam("b_boundary"),
    )
    .order_by(_CHECKPOINTS.c.id.desc())
    .limit(1)
)

#: A step's messages, each row with the latest checkpoint's boundary (one
#: statement for both): the content only of rows newer than the cache's
#: newest (``b_newest``); with ``b_skip``, only from the boundary on.
_STORED = (
    select(
        _MESSAGES.c.id,
        _MESSAGES.c.created_at,
        _MESSAGES.c.role,
        _MESSAGES.c.input_tokens,
        _MESSAGES.c.output_tokens,
        _MESSAGES.c.cost_usd,
        case((_MESSAGES.c.id > bindparam("b_newest"), _MESSAGES.c.content), else_=None),
        _BOUNDARY,
    )
    .where(
        _MESSAGES.c.conversation_id == bindparam("b_conv"),
        _MESSAGES.c.id
        > case(
            (bindparam("b_skip", type_=Boolean) & _BOUNDARY.is_not(None), _BOUNDARY - 1),
            else_=0,
        ),
    )
    .order_by(_MESSAGES.c.id)
)
_CONTENTS = select(_MESSAGES.c.id, _MESSAGES.c.content).where(
    _MESSAGES.c.id.in_(bindparam("b_ids", expanding=True))
)


def message_rows(session: Session, conversation_id: str, after: int = 0) -> list[MessageRow]:
    """The conversation's stored messages with an id above ``after``, in order."""
    return list(
        session.scalars(
            select(MessageRow)
            .where(col(MessageRow.conversation_id) == conversation_id, col(MessageRow.id) > after)
            .order_by(col(MessageRow.id))
        ).all()
    )


def latest_checkpoint(session: Session, conversation_id: str) -> Any:
    """The boundary message id and summary of the conversation's latest checkpoint."""
    return session.execute(_LATEST_CHECKPOINT, {"b_conv": conversation_id}).first()


def stored_messages(db: Db, conversation_id: str, skip: bool, newest: int) -> Sequence[Any]:
    """The messages a step reads: id, created_at, role, input and output
    tokens, cost, content (only above id ``newest``) and the latest
    checkpoint's boundary id; only from that boundary on if ``skip``."""
    params = {"b_conv": conversation_id, "b_skip": skip, "b_newest": newest}
    return execute(connection_of(db), _STORED, params).all()


def message_contents(db: Db, ids: list[int]) -> Sequence[Any]:
    """The id and content of each message of ``ids``."""
    return connection_of(db).execute(_CONTENTS, {"b_ids": ids}).all()


def checkpoint_summary(db: Db, conversation_id: str, boundary_id: int) -> str | None:
    """The summary of the conversation's latest checkpoint at that boundary."""
    params = {"b_conv": conversation_id, "b_boundary": boundary_id}
    found: str | None = execute(connection_of(db), _SUMMARY, params).scalar()
    return found


def delete_messages(session: Session, conversation_id: str) -> int:
    """Delete the conversation's messages; returns how many."""
    result = session.execute(
        delete(MessageRow).where(col(MessageRow.conversation_id) == conversation_id)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def store_plan(session: Session, conversation_id: str, plan: list[dict[str, Any]]) -> None:
    """Replace the conversation's plan."""
    session.execute(
        update(Conversation).where(col(Conversation.id) == conversation_id).values(plan=plan)
    )
