"""Reading a conversation's stored messages as content-model messages."""

from __future__ import annotations

from sqlmodel import Session, col, select

from orchestrator.store.tables import MessageRow
from schemas import Message, Role, Usage, content_blocks_adapter


def row_to_message(row: MessageRow) -> Message:
    usage = None
    if row.input_tokens is not None:
        usage = Usage(
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens or 0,
            cost_usd=row.cost_usd or 0.0,
        )
    return Message(
        role=Role(row.role),
        content=content_blocks_adapter.validate_python(row.content),
        usage=usage,
    )


def load_history(session: Session, conversation_id: str) -> list[Message]:
    rows = session.exec(
        select(MessageRow)
        .where(MessageRow.conversation_id == conversation_id)
        .order_by(col(MessageRow.id))
    ).all()
    return [row_to_message(r) for r in rows]


def copy_messages(session: Session, source_id: str, target_id: str) -> None:
    """Copy every message of conversation ``source_id`` to ``target_id``."""
    rows = session.exec(
        select(MessageRow)
        .where(MessageRow.conversation_id == source_id)
        .order_by(col(MessageRow.id))
    ).all()
    session.add_all(
        MessageRow(
            conversation_id=target_id,
            turn_id=row.turn_id,
            step=row.step,
            kind=row.kind,
            role=row.role,
            content=row.content,
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            cost_usd=row.cost_usd,
        )
        for row in rows
    )
