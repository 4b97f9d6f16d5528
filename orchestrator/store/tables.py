"""SQLModel tables: conversations, turns, messages, tool calls, events (docs/architecture.md).

A conversation carries the loop's cursor: ``(turn_id, cursor_step,
cursor_segment)`` plus ``version`` for compare-and-set. ``cursor_segment``
is ``-1`` while the step's model call is due, else the tool segment that
runs. A step takes a lease (``lease_owner``/``lease_until``) before
calling the model.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Index, Table, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

from schemas.jobs import DEFAULT_PRIORITY

JsonType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on Postgres and SQLite alike."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


#: Statuses of a tool call that has its one result.
CALL_FINISHED = ("completed", "failed", "cancelled")


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


def _time(nullable: bool = False, index: bool = False) -> Any:
    return Field(
        default_factory=utcnow if not nullable else None,
        sa_column_kwargs={},
        sa_type=UTCDateTime,
        nullable=nullable,
        index=index,
    )


def _json(default: Any = None) -> Any:
    if default is None:
        return Field(default=None, sa_column=Column(JsonType, nullable=True))
    return Field(default_factory=default, sa_column=Column(JsonType, nullable=False))


class Conversation(SQLModel, table=True):
    __tablename__ = "chorus_conversation"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=64)
    root_id: str = Field(index=True, max_length=64)
    parent_id: str | None = Field(default=None, index=True, max_length=64)
    agent: str = Field(max_length=64)
    agent_spec: dict[str, Any] = _json(dict)
    state: str = Field(default="idle", max_length=16)
    turn_id: str | None = Field(default=None, max_length=64)
    cursor_step: int = 0
    cursor_segment: int = -1
    version: int = 0
    progress_at: datetime = _time()
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_until: datetime | None = _time(nullable=True)
    #: A deferred step (retry backoff, rate limit) is due at this time; the
    #: sweeper leaves the position alone until then (plus the stall timeout).
    due_at: datetime | None = _time(nullable=True)
    #: How often the sweeper re-sent the current cursor position; every
    #: cursor move resets it. Past a bound the turn fails.
    redispatches: int = 0
    #: Failed model calls at the cursor's current position: the retry count
    #: the step's policies see as ``attempt - 1`` (every cursor move resets it).
    step_failures: int = 0
    #: Those failures, oldest first (model, status, retryable, error): what a
    #: policy decides by across task boundaries (``orchestrator/policies``).
    step_failure_log: list[dict[str, Any]] | None = _json()
    #: The priority of the job whose turn this conversation runs (0-9,
    #: higher first): every task serving the cursor is sent with it.
    priority: int = DEFAULT_PRIORITY
    depth: int = 0
    children: int = 0
    #: ``main``, ``subagent`` or ``checkpoint`` (a summarizer's ephemeral child).
    kind: str = Field(default="main", max_length=16)
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    #: The agent's todo list (``manage_todo_list``), items as ``TodoItem`` dicts.
    plan: list[dict[str, Any]] | None = _json()
    #: The tenant of the HTTP API token whose job created this root
    #: conversation (``orchestrator/server``); None for the Python client's.
    #: A conversation belongs to its root's tenant.
    tenant: str | None = Field(default=None, index=True, max_length=64)
    created_at: datetime = _time()

    __table_args__ = (Index("ix_chorus_conversation_running", "state", "progress_at"),)


class Turn(SQLModel, table=True):
    __tablename__ = "chorus_turn"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=64)
    conversation_id: str = Field(index=True, max_length=64)
    root_id: str = Field(index=True, max_length=64)
    number: int
    agent: str = Field(max_length=64)
    status: str = Field(default="running", max_length=16)
    input_text: str = Field(sa_type=Text)
    context_data: dict[str, Any] = _json(dict)
    idempotency_key: str | None = Field(default=None, unique=True, max_length=200)
    correlation_id: str = Field(default_factory=new_id, index=True, max_length=64)
    parent_call_id: str | None = Field(default=None, unique=True, index=True, max_length=64)
    #: The job this turn belongs to: its own id for a top-level turn, the
    #: top-level turn's for a subagent's. Budgets and tree usage live there.
    job_id: str | None = Field(default=None, index=True, max_length=64)
    budget: dict[str, Any] | None = _json()
    tree_input_tokens: int = 0
    tree_output_tokens: int = 0
    tree_cost_usd: float = 0.0
    tree_steps: int = 0
    tree_tool_calls: int = 0
    #: Subagent conversations started by this job (on the job's turn).
    tree_children: int = 0
    #: Set durably before a job's tree is stopped (cancel, budget): the
    #: status the tree ends with and why. Steps and tools of a stopping
    #: job leave instead of starting work.
    stop_status: str | None = Field(default=None, max_length=16)
    stop_reason: str | None = Field(default=None, sa_type=Text)
    output: str | None = Field(default=None, sa_type=Text)
    structured: Any = _json()
    error: str | None = Field(default=None, sa_type=Text)
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    started_at: datetime = _time()
    finished_at: datetime | None = _time(nullable=True)


class MessageRow(SQLModel, table=True):
    """One stored message. ``kind`` is ``input``, ``assistant`` or ``tool_results``."""

    __tablename__ = "chorus_message"

    id: int | None = Field(default=None, primary_key=True)
    conversation_id: str = Field(index=True, max_length=64)
    turn_id: str = Field(max_length=64)
    step: int
    kind: str = Field(max_length=16)
    role: str = Field(max_length=16)
    content: list[dict[str, Any]] = _json(list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    created_at: datetime = _time()

    __table_args__ = (
        UniqueConstraint(
            "conversation_id", "turn_id", "step", "kind", name="uq_chorus_message_slot"
        ),
    )


class ToolCallRow(SQLModel, table=True):
    __tablename__ = "chorus_tool_call"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=64)
    conversation_id: str = Field(max_length=64)
    turn_id: str = Field(index=True, max_length=64)
    step: int
    position: int
    segment: int
    tool_request_id: str = Field(max_length=200)
    tool: str = Field(max_length=200)
    params: dict[str, Any] = _json(dict)
    parallelizable: bool = True
    queue: str = Field(default="tools", max_length=64)
    status: str = Field(default="pending", max_length=16)
    result: Any = _json()
    #: Set when the result passed the agent's ``tool_output_limit``: the
    #: row keeps it whole (advance clears every other result) and the model
    #: saw a view of this many characters (``orchestrator/engine/tool_outputs.py``).
    view_chars: int | None = None
    is_error: bool = False
    attempts: int = 0
    task_id: str | None = Field(default=None, max_length=64)
    started_at: datetime | None = _time(nullable=True)
    finished_at: datetime | None = _time(nullable=True)
    created_at: datetime = _time()

    __table_args__ = (
        UniqueConstraint("turn_id", "step", "position", name="uq_chorus_tool_call_slot"),
    )


class CheckpointRow(SQLModel, table=True):
    """A summary of a conversation up to (and including) a boundary message."""

    __tablename__ = "chorus_checkpoint"

    id: int | None = Field(default=None, primary_key=True)
    conversation_id: str = Field(index=True, max_length=64)
    boundary_message_id: int
    summary: str = Field(sa_type=Text)
    summarizer_conversation_id: str = Field(max_length=64)
    created_at: datetime = _time()


class EventRow(SQLModel, table=True):
    __tablename__ = "chorus_event"

    id: int | None = Field(default=None, primary_key=True)
    root_id: str = Field(max_length=64)
    #: Increasing per root, not contiguous (see ``orchestrator/events.py``).
    seq: int = Field(sa_type=BigInteger)
    name: str = Field(max_length=64)
    conversation_id: str = Field(max_length=64)
    turn_id: str | None = Field(default=None, max_length=64)
    step: int | None = None
    correlation_id: str | None = Field(default=None, max_length=64)
    data: dict[str, Any] = _json(dict)
    created_at: datetime = _time()

    __table_args__ = (UniqueConstraint("root_id", "seq", name="uq_chorus_event_seq"),)


def table(model: type[SQLModel]) -> Table:
    """The Core table of a SQLModel table class (SQLModel leaves
    ``__table__`` untyped)."""
    found = model.__table__  # type: ignore[attr-defined]
    assert isinstance(found, Table)
    return found
