"""Budgets per job, rolled up over the whole subagent tree.

Every step adds its tokens, cost and tool calls to the job's turn (the
top-level turn of the tree). A step checks the job's budget before calling
the model: a spent tool-call budget takes the tools away for one last
answer; any other exceeded limit stops the tree with ``budget.exceeded``.
A wall-time budget is also enforced while the job waits on tools and
children: a ``chorus.deadline`` task sent at submit (and the sweeper, as a
backstop) stops the tree the way a cancel does, when the time is up.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import bindparam, select, update
from sqlmodel import Session

from orchestrator.events import ConversationIds, Outbox, TurnIds
from orchestrator.store.tables import Conversation, Turn, table, utcnow
from schemas import Budget, EventName, Usage

#: What the model is told when the tool-call budget is spent.
NO_MORE_TOOLS = (
    "The tool-call budget of this job is spent: answer now from what you have, without tools."
)


_TURNS = table(Turn)
_CONVERSATIONS = table(Conversation)


class JobRow(NamedTuple):
    """A child's job's turn as the lease statement returns it
    (:data:`JOB_ROW_COLUMNS`), without loading the entity."""

    id: str
    budget: dict[str, Any] | None
    tree_input_tokens: int
    tree_output_tokens: int
    tree_cost_usd: float
    tree_steps: int
    tree_tool_calls: int
    started_at: datetime


#: The columns of :class:`JobRow`, in order.
JOB_ROW_COLUMNS = JobRow._fields

#: What a step reads of its job's turn before the model call.
JobTotals = Turn | JobRow

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

#: The job's tool calls so far, read afresh once the root's row is locked
#: (:func:`~orchestrator.engine.persist._tool_calls_left`).
TREE_TOOL_CALLS = select(_TURNS.c.tree_tool_calls).where(_TURNS.c.id == bindparam("b_job"))

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


def job_of(session: Session, turn: Turn) -> Turn:
    """The turn of ``turn``'s job, as ``session`` holds it: ``turn`` itself
    for a job's own turn in the session, without an identity-map lookup."""
    if turn.job_id in (None, turn.id) and turn in session:
        return turn
    job = session.get(Turn, turn.job_id or turn.id)
    assert job is not None
    return job


def exceeded(job: JobTotals) -> str | None:
    """Why the job's budget is exceeded (tool calls aside), or None."""
    if not job.budget:
        return None
    budget = Budget.model_validate(job.budget)
    tokens = job.tree_input_tokens + job.tree_output_tokens
    elapsed = (utcnow() - job.started_at).total_seconds()
    checks = [
        (budget.cost_usd, job.tree_cost_usd, "cost", "USD"),
        (budget.tokens, tokens, "tokens", "tokens"),
        (budget.steps, job.tree_steps, "steps", "model calls"),
        (budget.wall_seconds, elapsed, "wall time", "s"),
    ]
    for limit, used, what, unit in checks:
        if limit is not None and used >= limit:
            return f"{what} budget exceeded: {used:g} {unit} used of {limit:g}"
    return None


def wall_time_left(job: JobTotals) -> float | None:
    """Seconds until the job's wall-time budget is spent (None: no such budget)."""
    if not job.budget:
        return None
    limit = Budget.model_validate(job.budget).wall_seconds
    return None if limit is None else limit - (utcnow() - job.started_at).total_seconds()


def tool_calls_left(job: JobTotals) -> int | None:
    """Tool calls the job may still make (None: unlimited)."""
    if not job.budget:
        return None
    limit = Budget.model_validate(job.budget).tool_calls
    return None if limit is None else max(0, limit - job.tree_tool_calls)


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


def record_paid(
    session: Session,
    outbox: Outbox,
    conv: Conversation,
    turn: Turn,
    step: int,
    usage: Usage,
    **flags: bool,
) -> None:
    """A model call outside a stored step was still paid for: add it to the
    job's tree totals and say so in a ``usage`` event marked by ``flags``."""
    roll_up(session, job_of(session, turn).id, usage, 0)
    record_usage(outbox, conv, turn, step, usage, **flags)


def record_usage(
    outbox: Outbox,
    conv: ConversationIds,
    turn: TurnIds,
    step: int,
    usage: Usage,
    **flags: bool,
) -> None:
    """The ``usage`` event of one model call (``flags``: how it was paid for)."""
    outbox.record(
        EventName.USAGE,
        conv,
        turn,
        step,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cost_usd=usage.cost_usd,
        **flags,
    )
