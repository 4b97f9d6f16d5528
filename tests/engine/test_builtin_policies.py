"""The built-in policies every agent's calls go through (max steps, budget,
tool access, context fitting, rate limits, retry), the agents' own policies
around subagent calls, and the bounds on an agent's policy list."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from orchestrator import Agent, ChorusError, ConfigurationError, JobFailedError, tool
from orchestrator.policies import Defer, ModelCall, Policy, Stop, ToolCall, register_policy
from orchestrator.store.tables import Turn
from orchestrator.testing import FunctionModel, Harness, ModelRequest, Reply, call
from schemas import AgentSpec, Budget, EventName
from schemas.specs import MAX_POLICIES
from tests.services import Services


class Seen(Policy):
    """Records the steps whose model calls it saw and the subagent answers
    it observed; guards subagent calls: refuses a task that says
    "forbidden", shouts any other."""

    steps: list[int] = []
    answers: list[tuple[str, Any, bool]] = []

    def before_model(self, call: ModelCall) -> ModelCall:
        type(self).steps.append(call.step)
        return call

    def before_tool(self, call: ToolCall) -> ToolCall | Stop:
        if not call.tool.startswith("subagent__"):
            return call
        task = str(call.params.get("task", ""))
        if "forbidden" in task:
            return Stop("no forbidden tasks")
        return call.rewrite(params={**call.params, "task": task.upper()})

    def after_tool(self, call: ToolCall, result: Any, is_error: bool) -> None:
        if call.tool.startswith("subagent__"):
            type(self).answers.append((call.tool, result, is_error))


register_policy("bp-seen", Seen())


class Later(Policy):
    """Defers the first run of the first ``bp_echo`` call it sees by 0.3 s
    (state in process memory: a test's shortcut; the harness is one process)."""

    deferred: list[str] = []
    runs: list[str] = []

    def before_tool(self, call: ToolCall) -> ToolCall | Defer:
        if not type(self).deferred:
            type(self).deferred.append(call.call_id)
            return Defer(0.3, "later")
        return call

    def after_tool(self, call: ToolCall, result: Any, is_error: bool) -> None:
        type(self).runs.append(call.call_id)


register_policy("bp-later", Later())


@tool
def bp_noop() -> str:
    """Does nothing."""
    return "ok"


Agent("bp-looping", "test/looping", tools=[bp_noop], max_steps=2, policies=["bp-seen"])


@tool
def bp_echo(word: str) -> str:
    """Says the word back."""
    return word


Agent("bp-child", "test/child")
Agent("bp-deferring", "test/deferring", tools=[bp_echo], policies=["bp-later"])
Agent("bp-parent", "test/parent", subagents=["bp-child"], policies=["bp-seen"])


def _model(request: ModelRequest) -> Reply | str:
    if request.model == "test/looping":
        return Reply.call(call("bp_noop"))
    if request.model == "test/deferring":
        if not request.tool_results:  # two calls of one parallel segment
            return Reply.call(call("bp_echo", word="one"), call("bp_echo", word="two"))
        return " ".join(request.tool_results)
    if request.model == "test/child":
        return f"child got: {request.user_text}"
    if not request.tool_results:  # the parent delegates what it was asked
        return Reply.call(call("subagent__bp-child", task=request.user_text))
    return f"parent heard: {request.tool_results[0]}"


@pytest.fixture(scope="module")
def harness(services: Services) -> Iterator[Harness]:
    """On the test services' Postgres and Redis: the store statements the fleet runs."""
    with Harness(
        model=FunctionModel(_model),
        redis_url=services.redis_url,
        database_url=services.database_url,
    ) as h:
        yield h


@pytest.fixture(autouse=True)
def _fresh() -> None:
    Seen.steps, Seen.answers = [], []


def test_max_steps_stops_the_turn_before_the_agents_policies_see_the_call(
    harness: Harness,
) -> None:
    job = harness.client.submit("bp-looping", "loop")
    # the built-in's stop is the turn's error as it says it, not "policy ... stopped"
    with pytest.raises(JobFailedError, match=r"no final answer within max_steps=2$"):
        job.result(timeout=30)
    assert Seen.steps == [0, 1]  # the third call never reached the agent's policy


def test_a_spent_budget_stops_the_tree_before_the_agents_policies_see_the_call(
    harness: Harness,
) -> None:
    job = harness.client.submit("bp-looping", "loop", budget=Budget(steps=1))
    with pytest.raises(JobFailedError, match="steps budget exceeded: 1 model calls used of 1"):
        job.result(timeout=30)
    assert Seen.steps == [0]
    names = [e.name for e in harness.events(job)]
    assert names.count(EventName.BUDGET_EXCEEDED) == 1
    assert names[-1] is EventName.TURN_FAILED


def test_a_subagent_call_goes_through_the_agents_tool_hooks(harness: Harness) -> None:
    # Given a policy whose before_tool shouts a subagent's task
    answer = harness.client.submit("bp-parent", "find the keys").result(timeout=30)
    # Then the child got the rewritten task
    assert answer == "parent heard: child got: FIND THE KEYS"
    # and its answer went through the policy's after_tool, once
    assert Seen.answers == [("subagent__bp-child", "child got: FIND THE KEYS", False)]


def test_a_policy_can_refuse_a_subagent_call(harness: Harness) -> None:
    job = harness.client.submit("bp-parent", "a forbidden errand")
    answer = job.result(timeout=30)
    assert answer == (
        "parent heard: Error: tool call refused by policy 'bp-seen': no forbidden tasks"
    )
    names = [e.name for e in harness.events(job)]
    assert EventName.SUBAGENT_STARTED not in names  # no child was started
    assert Seen.answers == []  # a refused call's answer is not a run's: no after_tool


def test_a_policy_can_defer_a_tool_call(harness: Harness) -> None:
    # Given a policy that defers the first of two parallel calls by 0.3 s
    Later.deferred, Later.runs = [], []
    began = time.monotonic()
    job = harness.client.submit("bp-deferring", "say")

    # Then the step waits for it: both results reach the model, in order
    assert job.result(timeout=30) == "one two"
    assert time.monotonic() - began >= 0.3
    # and each call ran once, the deferred one after the other
    assert len(Later.runs) == 2 and Later.runs[-1] == Later.deferred[0]
    calls = [e for e in harness.events(job) if e.name is EventName.TOOL_STARTED]
    assert [e.data["attempt"] for e in calls] == [1, 1]  # a deferral is not a run


@pytest.mark.parametrize(
    "name", ["retry", "rate-limits", "max-steps", "budget", "tool-access", "context-fit"]
)
def test_a_built_in_policys_name_cannot_be_registered(name: str) -> None:
    with pytest.raises(ConfigurationError, match="built-in"):
        register_policy(name, Policy())


@pytest.mark.parametrize(
    ("policies", "says"),
    [
        (["bp-seen"] * 5_000, "at most 32"),  # the attack: one hook run 5,000 times a call
        (["bp-seen", "bp-seen"], "more than once"),
        ([f"p{i}" for i in range(MAX_POLICIES + 1)], "at most 32"),
        (["bad name!"], "pattern"),
    ],
)
def test_an_agents_policy_list_is_bounded_and_names_each_once(
    policies: list[str], says: str
) -> None:
    with pytest.raises(ChorusError, match=says):
        Agent("bp-many", "test/looping", policies=policies)
    # and a spec off the wire (an inline job's) is refused the same way
    wire: dict[str, Any] = {"name": "bp-many", "model": "test/looping", "policies": policies}
    with pytest.raises(ValidationError, match=says):
        AgentSpec.model_validate(wire)


def test_structured_output_attempts_are_counted_in_the_turns_row() -> None:
    class Trip(BaseModel):
        city: str
        nights: int

    Agent("bp-stubborn", "test/stubborn", output=Trip, output_retries=1)

    def stubborn(request: ModelRequest) -> Reply | str:
        return Reply.call(call("final_answer", city="Lisbon", nights="three"))

    with Harness(model=FunctionModel(stubborn)) as h:
        job = h.client.submit("bp-stubborn", "plan")
        with pytest.raises(JobFailedError, match="no valid structured output after 2 attempts"):
            job.result(timeout=30)
        with h.runtime.session() as session:
            turn = session.get(Turn, job.id)
            assert turn is not None and turn.output_attempts == 2
