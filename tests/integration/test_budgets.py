"""Budgets per job, rolled up over the subagent tree."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import col, select

from orchestrator import Client, JobFailedError, Settings
from orchestrator.store.tables import Turn
from schemas import Budget, EventName, TurnStatus
from tests.agents import gate_path
from tests.conftest import tool_calls
from tests.integration.test_stops import _lock_waiters, _until

pytestmark = pytest.mark.integration


def test_children_costs_together_pass_the_root_budget(client: Client, workers: Any) -> None:
    # Given a parent whose three children cost 0.30 USD each, and a 0.50 USD budget
    job = client.submit("budget-lead", "spend", budget=Budget(cost_usd=0.5))

    # Then the job stops with budget.exceeded once the tree has spent it. Each step
    # checks the budget before its model call, so who notices is a race: the parent
    # after all three children (0.9 used), or the third child, if it starts after
    # the other two have spent 0.6 (it then makes no call)
    with pytest.raises(
        JobFailedError, match=r"cost budget exceeded: (0\.[69]) USD used of 0\.5"
    ) as e:
        job.result(timeout=60)
    used = float(re.search(r"(0\.[69]) USD", str(e.value)).group(1))  # type: ignore[union-attr]
    status = job.status()
    assert status.status is TurnStatus.FAILED
    # and the job's usage includes every child that called its model
    assert status.tree_usage.cost_usd == pytest.approx(used)
    calls = round(used / 0.3)
    assert status.tree_usage.input_tokens >= 100 * calls
    assert status.tree_usage.output_tokens >= 100 * calls
    assert status.usage.cost_usd == 0.0  # the parent's own (unpriced) calls
    events = list(job.events(deltas=False, timeout=5))
    exceeded = [e for e in events if e.name is EventName.BUDGET_EXCEEDED]
    assert len(exceeded) == 1 and "cost budget exceeded" in exceeded[0].data["reason"]
    assert events[-1].name is EventName.TURN_FAILED


def test_spent_tool_budget_leaves_one_last_answer_without_tools(
    client: Client, workers: Any
) -> None:
    job = client.submit("toolhungry", "add", budget=Budget(tool_calls=2))
    answer = job.result(timeout=60)
    assert answer.startswith("out of tools:")
    calls = tool_calls(client, job.id)
    assert [(c.status, c.result) for c in calls[:2]] == [("completed", 3), ("completed", 7)]
    assert calls[2].is_error and "tool-call budget of this job is spent" in calls[2].result
    assert job.status().step == 2


def test_children_storing_calls_at_once_stay_within_the_tool_call_budget(
    client: Client, workers: Any, settings: Settings
) -> None:
    # Given a job of 3 tool calls whose lead spent 2 on two children, each
    # about to call a tool once its model call is let go
    gate = uuid.uuid4().hex
    job = client.submit("adder-lead", gate, budget=Budget(tool_calls=3))
    for child in "ab":
        started = gate_path(settings.state_dir, f"{gate}-{child}-started")
        _until(started.exists, "a child's model call never started")
    with client.runtime.session() as barrier:
        # ... and the root's row held while both store their replies at once
        barrier.execute(
            text("SELECT id FROM chorus_conversation WHERE id = :id FOR UPDATE"),
            {"id": job.root_id},
        )
        for child in "ab":
            gate_path(settings.state_dir, f"{gate}-{child}").touch()
        _until(lambda: _lock_waiters(client) >= 2, "the children never both waited to store")
    job.result(timeout=60)

    # Then the tree ran 3 tool calls, not 4: one child's call ran, the other's was refused
    with client.runtime.session() as s:
        children = s.exec(
            select(Turn.id).where(Turn.job_id == job.id, col(Turn.parent_call_id).is_not(None))
        ).all()
        spent = s.exec(select(Turn.tree_tool_calls).where(Turn.id == job.id)).one()
    calls = [c for turn in children for c in tool_calls(client, turn)]
    assert sorted(c.status for c in calls) == ["completed", "failed"]
    assert "tool-call budget of this job is spent" in next(c.result for c in calls if c.is_error)
    assert spent == 3
