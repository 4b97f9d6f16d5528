"""The planner → implementer → critic pipeline of examples/pipeline.py,
through real worker processes: it ends when the critic approves, or when a
budget of the job's tree ends it, and the job's status says which."""

from __future__ import annotations

from typing import Any

import pytest
from sqlmodel import select

from examples.pipeline import CRITIC, IMPLEMENTER, PLANNER, pipeline_budget
from orchestrator import Client, JobFailedError
from orchestrator.store.tables import Conversation, Turn
from schemas import Budget, EventName, TurnStatus

pytestmark = pytest.mark.integration


def _task(*requirements: str) -> str:
    return "Write slugify(title).\n" + "".join(f"- {r}\n" for r in requirements)


def _children(client: Client, root_id: str) -> list[tuple[str, Any]]:
    """The agent and structured answer of every subagent turn, in order."""
    with client.runtime.session() as s:
        rows = s.exec(
            select(Conversation.agent, Turn.structured)
            .join(Turn, Turn.conversation_id == Conversation.id)
            .where(Conversation.root_id == root_id, Conversation.id != root_id)
            .order_by(Turn.started_at)
        ).all()
    return [(agent, structured) for agent, structured in rows]


def test_the_critic_approves_on_the_second_iteration(client: Client, workers: Any) -> None:
    # Given a task of two requirements: the first plan covers one of them
    job = client.submit(PLANNER, _task("lowercase the title", "join the words with hyphens"))

    # Then the critic rejects the first draft, naming what it misses, and
    # approves the second; the job completes with the approved draft
    answer = job.result(timeout=120)
    assert answer.startswith("Approved on iteration 2.\ndef slugify")
    assert "# done: join the words with hyphens" in answer
    assert _children(client, job.root_id) == [
        (IMPLEMENTER, None),
        (CRITIC, {"approved": False, "feedback": "join the words with hyphens"}),
        (IMPLEMENTER, None),
        (CRITIC, {"approved": True, "feedback": ""}),
    ]
    # And three models were paid for, within the agent's default budget
    status = job.status()
    assert status.status is TurnStatus.COMPLETED and status.error is None
    assert status.tree_usage.cost_usd > status.usage.cost_usd > 0
    assert status.step == 5  # two planner steps an iteration, then its answer


def test_the_iteration_budget_ends_a_pipeline_the_critic_never_approves(
    client: Client, workers: Any
) -> None:
    # Given six requirements (approval would take six iterations) and a
    # budget of two iterations
    requirements = [f"requirement {i}" for i in range(6)]
    job = client.submit(PLANNER, _task(*requirements), budget=pipeline_budget(iterations=2))

    # Then the tree stops once two iterations' model calls are spent, and
    # the job's status says so
    with pytest.raises(JobFailedError, match="steps budget exceeded"):
        job.result(timeout=120)
    status = job.status()
    assert status.status is TurnStatus.FAILED
    assert status.error == "steps budget exceeded: 9 model calls used of 9"
    verdicts = [s for agent, s in _children(client, job.root_id) if agent == CRITIC]
    assert verdicts == [
        {"approved": False, "feedback": "requirement 1"},
        {"approved": False, "feedback": "requirement 2"},
    ]
    events = list(job.events(deltas=False, timeout=10))
    assert [e.data["reason"] for e in events if e.name is EventName.BUDGET_EXCEEDED] == [
        status.error
    ]


def test_a_cost_budget_ends_the_pipeline(client: Client, workers: Any) -> None:
    # Given a budget of 0.015 USD: an iteration costs about 0.0105
    requirements = [f"requirement {i}" for i in range(6)]
    job = client.submit(PLANNER, _task(*requirements), budget=Budget(cost_usd=0.015))

    # Then the second iteration's draft passes it (0.0183 USD), the planner's
    # next step does not start, and the status names the cost budget
    with pytest.raises(JobFailedError, match="cost budget exceeded"):
        job.result(timeout=120)
    status = job.status()
    assert status.status is TurnStatus.FAILED
    assert status.error == f"cost budget exceeded: {status.tree_usage.cost_usd:g} USD used of 0.015"
    assert status.tree_usage.cost_usd == pytest.approx(0.0183)
    assert [agent for agent, _ in _children(client, job.root_id)] == [
        IMPLEMENTER,
        CRITIC,
        IMPLEMENTER,
    ]
