"""One row type per entity, as the store's named operations read it.

A named operation (take a lease, claim a call, start a child, answer a
parent, ...) reads a conversation as a :class:`ConversationRow`, a turn as
a :class:`TurnRow` (a job's turn too) and a tool call as a
:class:`CallRow`: plain tuples of the columns any of those operations
needs, no ORM entity (loading one costs more than the statement). Each
type has one list of columns (:func:`columns`) that every SELECT and
RETURNING of it uses, so a row is always built the same way
(:func:`take`), and an operation that reads a column another one needs
costs a few bytes, not another shape.

The ORM classes of :mod:`orchestrator.store.tables` stay the tables and
what a transaction that changes a whole row loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import ColumnElement, FromClause

from orchestrator.store.tables import Conversation


class ConversationRow(NamedTuple):
    """A conversation: its ids (what its events name), its agent, where its
    cursor is, and what a step and a child's start read of it."""

    id: str
    root_id: str
    agent_spec: dict[str, Any]
    turn_id: str | None
    cursor_step: int
    priority: int
    depth: int
    step_failures: int
    step_failure_log: list[dict[str, Any]] | None


class TurnRow(NamedTuple):
    """A turn: its ids (what its events name), what its tools see, its job,
    and, read as a job's turn, its stop mark, budget and tree totals
    (:mod:`orchestrator.engine.budget`)."""

    id: str
    correlation_id: str
    context_data: dict[str, Any]
    job_id: str | None
    status: str
    stop_status: str | None
    budget: dict[str, Any] | None
    tree_input_tokens: int
    tree_output_tokens: int
    tree_cost_usd: float
    tree_steps: int
    tree_tool_calls: int
    started_at: datetime


class CallRow(NamedTuple):
    """A tool call: what runs it (a tool task, a subagent's start) and what
    its answer's event and advance name."""

    id: str
    tool: str
    tool_request_id: str
    params: dict[str, Any]
    attempts: int
    step: int
    segment: int
    status: str
    answer: str | None  # a person's answer to a call that needed one


#: A conversation as the engine holds it: a named operation's row, or the
#: entity a transaction loaded to change it.
AnyConversation = ConversationRow | Conversation

Row = ConversationRow | TurnRow | CallRow
R = TypeVar("R", ConversationRow, TurnRow, CallRow)


def columns(
    row_type: type[Row], table: FromClause, label: str | None = None
) -> list[ColumnElement[Any]]:
    """The columns of ``row_type`` in ``table`` (or an alias of it), in the
    type's order; labelled ``<label>_<name>`` where a statement reads
    tables that share column names."""
    found = [table.c[name] for name in row_type._fields]
    if label is None:
        return list(found)
    return [column.label(f"{label}_{column.key}") for column in found]


def take(row_type: type[R], row: Sequence[Any], start: int = 0) -> tuple[R, int]:
    """The ``row_type`` read at ``start`` in ``row`` (as :func:`columns`
    selected it, beside other rows), and where the next one starts."""
    end = start + len(row_type._fields)
    return row_type._make(row[start:end]), end
