"""The job's tree totals in SQL: the lock of its root conversation's row
and the atomic roll-up of a model call's usage (the job's turn is read as
a :class:`~orchestrator.store.rows.TurnRow`), and a call's usage added to
one conversation's or turn's own totals. What a budget allows is decided in
:mod:`orchestrator.engine.budget`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select, update
from sqlmodel import Session, col

from orchestrator.store.tables import Conversation, Turn, table
from schemas import Usage

_TURNS = table(Turn)
_CONVERSATIONS = table(Conversation)


#: The job's root conversation row, locked (:func:`lock_job`). Statements
#: built once, executed with parameters: no statement building and no
#: cache-key generation per call.
LOCK_JOB = (
    select(_CONVERSATIONS.c.id)
    .where(
        _CONVERSATIONS.c.id
        == select(_TURNS.c.root_id).where(_TURNS.c.id == bindparam("b_job")).scalar_subquery()
    )
    .with_for_update()
)

#: The job's tool calls so far (:func:`tree_tool_calls`).
_TREE_TOOL_CALLS = select(_TURNS.c.tree_tool_calls).where(_TURNS.c.id == bindparam("b_job"))

#: The job's turn's columns that add one model call's usage to its tree
#: totals (atomic increments); :func:`tree_params` gives their parameters.
TREE_TOTALS: dict[str, Any] = {
    "tree_input_tokens": _TURNS.c.tree_input_tokens + bindparam("b_tree_input"),
    "tree_output_tokens": _TURNS.c.tree_output_tokens + bindparam("b_tree_output"),
    "tree_cost_usd": _TURNS.c.tree_cost_usd + bindparam("b_tree_cost"),
    "tree_steps": _TURNS.c.tree_steps + 1,
    "tree_tool_calls": _TURNS.c.tree_tool_calls + bindparam("b_tree_tool_calls"),
}

ROLL_UP = update(_TURNS).where(_TURNS.c.id == bindparam("b_job")).values(TREE_TOTALS)


def lock_job(session: Session, job_id: str) -> None:
    """Lock the job's root conversation row before the job's turn is written.

    A root-level step locks the root row, then writes the job's turn (its
    own). A child's transaction that wrote the job's turn first and then
    touched the root row (a child answering a call of the root) would take
    the two the other way round. Taking the root first everywhere the job's
    turn is written keeps one order. (Events no longer lock the root row:
    see ``orchestrator/events.py``.)"""
    session.execute(LOCK_JOB, {"b_job": job_id})


def tree_params(usage: Usage, tool_calls: int) -> dict[str, Any]:
    """The parameters of :data:`TREE_TOTALS` for one model call's usage and
    the ``tool_calls`` it runs."""
    return {
        "b_tree_input": usage.input_tokens,
        "b_tree_output": usage.output_tokens,
        "b_tree_cost": usage.cost_usd,
        "b_tree_tool_calls": tool_calls,
    }


def roll_up(
    session: Session, job_id: str, usage: Usage, tool_calls: int, *, locked: bool = False
) -> None:
    """Add one model call's usage to the job's tree totals (atomically);
    ``locked``: the caller holds :func:`lock_job` already.

    A Core update of the table, not of the entity: a turn object the
    session holds keeps the totals it was loaded with (nothing reads them
    after a roll-up), and no ORM bookkeeping runs per call."""
    if not locked:
        lock_job(session, job_id)
    session.execute(ROLL_UP, {"b_job": job_id, **tree_params(usage, tool_calls)})


def add_usage(
    session: Session, model: type[Conversation] | type[Turn], row_id: str, usage: Usage
) -> None:
    """Add a model call's usage to one conversation's or turn's own totals."""
    session.execute(
        update(model)
        .where(col(model.id) == row_id)
        .values(
            input_tokens=col(model.input_tokens) + usage.input_tokens,
            output_tokens=col(model.output_tokens) + usage.output_tokens,
            cost_usd=col(model.cost_usd) + usage.cost_usd,
        )
    )


def tree_tool_calls(session: Session, job_id: str) -> int:
    """The job's tool calls so far, read afresh (once the root's row is
    locked, it counts every call committed before)."""
    return int(session.execute(_TREE_TOOL_CALLS, {"b_job": job_id}).scalar_one())
