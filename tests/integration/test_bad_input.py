"""Bad input gets a clear, typed error and never harms a worker."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from orchestrator import (
    Client,
    InvalidRequestError,
    Job,
    UnknownAgentError,
    UnknownToolError,
)
from schemas import AgentSpec, TurnStatus
from tests.conftest import tool_calls

pytestmark = pytest.mark.integration


def test_unknown_agent_is_refused_at_submit(client: Client) -> None:
    with pytest.raises(UnknownAgentError, match=r"'nobody'.*trip-planner"):
        client.submit("nobody", "hi")


def test_inline_agent_naming_an_unknown_tool_is_refused(client: Client) -> None:
    spec = AgentSpec(name="inline", model="scripted/ordering", tools=("timed", "rm_rf"))
    with pytest.raises(UnknownToolError, match="'rm_rf'"):
        client.submit(spec, "hi")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"input": ""}, "input"),
        ({"input": "x" * 200_001}, "input"),
        ({"input": "hi", "context_data": {"blob": "y" * 300_000}}, "context_data"),
        ({"input": "hi", "idempotency_key": ""}, "idempotency_key"),
        ({"input": "hi", "conversation_id": "c" * 65}, "conversation_id"),
    ],
)
def test_malformed_requests_name_the_field(
    client: Client, kwargs: dict[str, Any], field: str
) -> None:
    text = kwargs.pop("input")
    with pytest.raises(InvalidRequestError) as caught:
        client.submit("trip-planner", text, **kwargs)
    assert field in caught.value.fields
    assert field in str(caught.value)


def test_model_mistakes_and_failing_tools_become_error_results(
    client: Client, workers: Any
) -> None:
    # Given a model that calls an unknown tool, passes bad and unparsable
    # arguments, and calls a tool that raises and one that times out
    job = client.submit("misbehaving", "do your worst")

    # Then the turn goes on to a final answer that saw every error
    answer = job.result(timeout=60)
    calls = tool_calls(client, job.id)
    results = [(c.tool, c.is_error, str(c.result)) for c in calls]
    assert results[0][1] and "tool 'no_such_tool' is not available" in results[0][2]
    assert results[1][1] and "a: Input should be a valid integer" in results[1][2]
    assert results[2][1] and "not a JSON object" in results[2][2]
    assert results[3][1] and "exploded: on purpose" in results[3][2]
    assert results[4][1] and "timed out after 0.5s" in results[4][2]
    assert results[5] == ("add", False, "5")
    for c in calls:  # the model was shown each result, errors included
        assert json.dumps(c.result) in answer
    # and the workers are unharmed
    assert client.submit("trip-planner", "still there?").result(timeout=60)


def test_garbage_task_payloads_leave_workers_unharmed(client: Client, workers: Any) -> None:
    # Tasks sent by hand with ids that name nothing, or the wrong shapes
    app = client.celery
    app.send_task("chorus.step", args=("nope", "nope", 0), queue="llm", ignore_result=True)
    app.send_task("chorus.tool", args=("nope",), queue="tools", ignore_result=True)
    app.send_task("chorus.advance", args=("nope", "x", 1, 2), queue="control", ignore_result=True)
    app.send_task("chorus.step", args=(), queue="llm", ignore_result=True)
    app.send_task("chorus.tool", kwargs={"bogus": 1}, queue="tools", ignore_result=True)
    job = client.submit("trip-planner", "after garbage")
    assert job.result(timeout=60)
    assert job.status().status is TurnStatus.COMPLETED
    assert all(w.proc.poll() is None for w in workers.values())


def _running_call(client: Client, job: Job) -> str:
    deadline = time.monotonic() + 60
    while not (running := [c for c in tool_calls(client, job.id) if c.status == "running"]):
        assert time.monotonic() < deadline, "no tool call ran"
        time.sleep(0.1)
    return running[0].id


@pytest.mark.parametrize("task", ["chorus.tool", "chorus.step", "chorus.advance"])
def test_a_task_naming_a_live_turn_in_a_forged_shape_does_not_fail_it(
    client: Client, workers: Any, task: str
) -> None:
    # Given a running turn: its model thinking (a step), or its tools running
    # (a tool call, an advance to come)
    job = client.submit("slow-answer" if task == "chorus.step" else "slow-batch", task)
    forged = {"id": job.conversation_id}
    if task == "chorus.step":
        time.sleep(1.0)
        args: tuple[Any, ...] = (forged, job.id, 0)
    elif task == "chorus.tool":
        args = ({"id": _running_call(client, job)},)
    else:
        _running_call(client, job)
        args = (forged, job.id, 0, 0)

    # When a task names its conversation or call as {"id": ...} (an identity
    # the database session would look up, where the task's statements refuse it)
    queue = {"chorus.step": "llm", "chorus.tool": "tools", "chorus.advance": "control"}[task]
    client.celery.send_task(task, args=args, queue=queue, ignore_result=True)

    # Then the turn runs on to its answer
    assert job.result(timeout=90)
    assert job.status().status is TurnStatus.COMPLETED
