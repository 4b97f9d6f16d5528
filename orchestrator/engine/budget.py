"""Budgets per job, rolled up over the whole subagent tree.

Every step adds its tokens, cost and tool calls to the job's turn (the
top-level turn of the tree). The built-in :class:`Budgets` policy checks
the job's budget before each model call: a spent tool-call budget takes
the tools away for one last answer; any other exceeded limit stops the
tree with ``budget.exceeded``.
A wall-time budget is also enforced while the job waits on tools and
children: a ``chorus.deadline`` task sent at submit (and the sweeper, as a
backstop) stops the tree the way a cancel does, when the time is up.
"""

from __future__ import annotations

from sqlmodel import Session

from orchestrator.events import ConversationIds, Outbox, TurnIds
from orchestrator.policies import ModelCall, Policy, Stop
from orchestrator.store.job_totals import roll_up
from orchestrator.store.rows import TurnRow
from orchestrator.store.tables import Conversation, Turn, utcnow
from schemas import Budget, EventName, Usage

#: What the model is told when the tool-call budget is spent.
NO_MORE_TOOLS = (
    "The tool-call budget of this job is spent: answer now from what you have, without tools."
)


#: What a step reads of its job's turn before the model call.
JobTotals = Turn | TurnRow


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


class Budgets(Policy):
    """The job's budget, a built-in policy every step's model call goes
    through (after :class:`~orchestrator.policies.max_steps.MaxSteps`,
    before the agent's own policies).

    ``before_model`` stops the call when a limit other than tool calls is
    spent: the engine then stops the job's whole tree with
    ``budget.exceeded`` (a stop by this policy is the job's, not just the
    turn's). :attr:`tools_allowed` is what the step asks before it builds
    the request: once the tool-call budget is spent, the model answers
    once more without tools. One instance a step, holding the job's
    totals the step read with its lease (no query of its own).
    """

    name = "budget"

    def __init__(self, job: JobTotals) -> None:
        self.job = job

    @property
    def tools_allowed(self) -> bool:
        """Whether the job may still make tool calls."""
        return tool_calls_left(self.job) != 0

    def before_model(self, call: ModelCall) -> ModelCall | Stop:
        over = exceeded(self.job)
        return call if over is None else Stop(over)


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
