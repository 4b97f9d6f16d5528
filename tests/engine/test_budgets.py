"""Budgets per job, rolled up over the subagent tree (on the harness)."""

from __future__ import annotations

import re

import pytest

from orchestrator import Client, JobFailedError
from schemas import Budget, EventName, TurnStatus
from tests.conftest import tool_calls


def test_children_costs_together_pass_the_root_budget(client: Client) -> None:
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


def test_spent_tool_budget_leaves_one_last_answer_without_tools(client: Client) -> None:
    job = client.submit("toolhungry", "add", budget=Budget(tool_calls=2))
    answer = job.result(timeout=60)
    assert answer.startswith("out of tools:")
    calls = tool_calls(client, job.id)
    assert [(c.status, c.result) for c in calls[:2]] == [("completed", 3), ("completed", 7)]
    assert calls[2].is_error and "tool-call budget of this job is spent" in calls[2].result
    assert job.status().step == 2
