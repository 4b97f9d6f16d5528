"""Reading a conversation's stored messages as content-model messages."""

from __future__ import annotations

from sqlmodel import Session, col, select

from orchestrator import context
from orchestrator.context import TransformContext
from orchestrator.store.tables import CheckpointRow, MessageRow
from schemas import AgentSpec, Message, Role, Usage, content_blocks_adapter


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
    return [row_to_message(r) for r in load_rows(session, conversation_id)]


def load_rows(session: Session, conversation_id: str) -> list[MessageRow]:
    return list(
        session.exec(
            select(MessageRow)
            .where(MessageRow.conversation_id == conversation_id)
            .order_by(col(MessageRow.id))
        ).all()
    )


def latest_checkpoint(session: Session, conversation_id: str) -> CheckpointRow | None:
    return session.exec(
        select(CheckpointRow)
        .where(CheckpointRow.conversation_id == conversation_id)
        .order_by(col(CheckpointRow.id).desc())
    ).first()


def model_context(session: Session, conversation_id: str, agent: AgentSpec) -> list[Message]:
    """The history the model sees: stored messages through the agent's transformers."""
    rows = load_rows(session, conversation_id)
    checkpoint = latest_checkpoint(session, conversation_id)
    boundary = None
    if checkpoint is not None:
        ids = [r.id for r in rows]
        boundary = (
            ids.index(checkpoint.boundary_message_id)
            if checkpoint.boundary_message_id in ids
            else None
        )
    ctx = TransformContext(
        agent=agent, boundary=boundary, summary=checkpoint.summary if checkpoint else None
    )
    return context.apply([row_to_message(r) for r in rows], ctx)


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
