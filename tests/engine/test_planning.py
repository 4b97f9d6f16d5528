"""Planning: the manage_todo_list tool, the stored plan, plan.updated, Client.plan."""

from __future__ import annotations

import pytest

from orchestrator import Client, ConversationNotFound
from schemas import EventName, TodoItem
from tests.agents import LONG_TODOS


def test_the_plan_is_written_refused_corrected_and_read(client: Client) -> None:
    # Given an agent with planning whose model writes a plan (beside another
    # tool call), then puts two items in progress, then corrects it
    job = client.submit("keeps-plan", "Plan a trip")

    # When the fleet runs the turn
    answer = job.result(timeout=60)
    events = list(job.events(deltas=False, timeout=10))

    # Then the plan was updated twice, each time with the whole list
    updates = [e.data["plan"] for e in events if e.name is EventName.PLAN_UPDATED]
    assert updates == [
        [
            {"id": 1, "title": "Check the weather", "status": "in-progress"},
            {"id": 2, "title": "Book", "status": "not-started"},
        ],
        [
            {"id": 1, "title": "Check the weather", "status": "completed"},
            {"id": 2, "title": "Book", "status": "in-progress"},
            *({"id": i, "title": t, "status": s} for i, t, s in LONG_TODOS),
        ],
    ]
    # the invalid plan was an error result naming why; the model saw it
    failed = [e.data["result"] for e in events if e.name is EventName.TOOL_FAILED]
    assert len(failed) == 1 and "at most one item may be in-progress; items [1, 2]" in failed[0]
    assert "at most one item may be in-progress" in answer
    # the other call of the first batch ran as usual
    assert "3" in answer and "Plan updated: 2 items" in answer
    assert "Plan updated: 10 items" in answer
    # and the client reads the plan as last written
    plan = [
        TodoItem(id=1, title="Check the weather", status="completed"),
        TodoItem(id=2, title="Book", status="in-progress"),
        *(TodoItem(id=i, title=t, status=s) for i, t, s in LONG_TODOS),
    ]
    assert client.plan(job.conversation_id) == plan
    assert job.plan() == plan
    # and clearing the conversation drops the plan with the history it was made for
    assert client.clear(job.conversation_id) > 0
    assert client.plan(job.conversation_id) == []


def test_planning_is_opt_in(client: Client) -> None:
    # Given an agent without planning whose model calls manage_todo_list anyway
    job = client.submit("plans-unasked", "Plan a trip")
    answer = job.result(timeout=60)

    # Then the call is refused like any tool the agent lacks, and no plan is kept
    assert "tool 'manage_todo_list' is not available to agent 'plans-unasked'" in answer
    events = list(job.events(deltas=False, timeout=10))
    assert not any(e.name is EventName.PLAN_UPDATED for e in events)
    assert client.plan(job.conversation_id) == []
    with pytest.raises(ConversationNotFound):
        client.plan("no-such-conversation")
