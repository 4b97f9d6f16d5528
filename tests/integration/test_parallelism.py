"""Parallelism caps and job priorities, through real worker processes.

``max_parallel_tools`` cuts a run of parallel calls into segments of at
most that many; ``submit(..., priority=...)`` goes with every task of the
job's tree, so a worker takes an interactive job's tasks before a backlog
of batch jobs, and the sweeper still sees tasks waiting in any priority
list.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlmodel import col, select

from orchestrator import Agent, Client, Settings
from orchestrator.errors import InvalidRequestError
from orchestrator.store.tables import Conversation, EventRow, Turn
from schemas import EventName
from tests.agents import LANES, RECORD_PRIORITIES, gate_path
from tests.conftest import WorkerProcess, tool_calls
from tests.integration import test_sweeper
from tests.integration.test_sweeper import Private, Sweeper, running

pytestmark = pytest.mark.integration

#: Settings and a client on a fresh key prefix: the sweeper tests' fixture.
private = test_sweeper.private


@pytest.fixture(scope="module")
def lanes(settings: Settings, client: Client) -> Iterator[WorkerProcess]:
    """A worker of the ``lanes`` queue with more slots than any cap tested."""
    worker = WorkerProcess(
        settings, "lanes", "-Q", "lanes", "-P", "threads", "-c", "16", "--without-mingle"
    )
    try:
        worker.wait_ready(client)
        yield worker
    finally:
        worker.stop()


def _answer_labels(answer: str) -> list[str]:
    return [r["label"] for r in json.loads(answer.removeprefix("results: "))]


def _events(client: Client, turn_id: str, name: EventName) -> int:
    with client.runtime.session() as s:
        return len(
            s.exec(
                select(EventRow.id).where(EventRow.turn_id == turn_id, EventRow.name == name.value)
            ).all()
        )


def test_twelve_parallel_calls_with_a_cap_of_four_run_as_three_segments(
    client: Client, workers: Any, lanes: WorkerProcess
) -> None:
    # Given an agent capped at 4 parallel tools, whose model asks for 12 at once,
    # and a worker with 16 slots for them
    # When it runs
    job = client.submit("capped-lanes", "go")
    answer = job.result(timeout=90)

    # Then the calls ran as three segments of four, one after the other,
    # never more than four at once
    calls = tool_calls(client, job.id)
    assert [c.segment for c in calls] == [0] * 4 + [1] * 4 + [2] * 4
    assert max(c.result["running"] for c in calls) == 4
    for segment in (1, 2):
        before = [c.result for c in calls if c.segment == segment - 1]
        now = [c.result for c in calls if c.segment == segment]
        assert min(r["start"] for r in now) >= max(r["end"] for r in before)
    # and the model saw the twelve results in order, and answered once
    labels = [f"l{i}" for i in range(LANES)]
    assert [c.result["label"] for c in calls] == labels
    assert _answer_labels(answer) == labels
    assert _events(client, job.id, EventName.TURN_COMPLETED) == 1
    assert _events(client, job.id, EventName.ASSISTANT_MESSAGE) == 2


def test_without_a_cap_the_same_batch_runs_at_once(
    client: Client, workers: Any, lanes: WorkerProcess
) -> None:
    # Given the same batch on an agent without a cap
    job = client.submit("open-lanes", "go")
    answer = job.result(timeout=90)

    # Then it is one segment, and the worker ran more than four at once
    calls = tool_calls(client, job.id)
    assert [c.segment for c in calls] == [0] * LANES
    assert max(c.result["running"] for c in calls) > 4
    assert _answer_labels(answer) == [f"l{i}" for i in range(LANES)]


def test_a_batchs_tool_tasks_keep_no_celery_result_or_subscription(
    client: Client, settings: Settings, workers: Any, lanes: WorkerProcess
) -> None:
    # Given a batch of parallel calls, run as a chord of tool tasks
    job = client.submit("open-lanes", "go")
    job.result(timeout=90)

    # Then the chord joined them, yet Redis holds no Celery result of any
    # (results live in Postgres; a stored one would be kept for a day), and
    # the worker that sent them keeps no subscription to one (each would
    # hold memory in that worker for good: no result ever comes)
    calls = tool_calls(client, job.id)
    assert len(calls) == LANES and all(c.result for c in calls)
    results = f"{settings.redis_prefix}:celery-task-meta-"
    with redis.Redis.from_url(settings.redis_url) as r:
        assert r.exists(*[results + c.id for c in calls]) == 0
        deadline = time.monotonic() + 10
        while (subscribed := r.pubsub_channels(results + "*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert subscribed == []


@pytest.mark.parametrize("cap", [0, -1, 2.5, "4", True])
def test_a_bad_cap_is_refused(cap: Any) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Agent("bad-cap", "scripted/lanes", max_parallel_tools=cap)
    assert caught.value.fields == ["max_parallel_tools"]


@pytest.mark.parametrize("priority", [-1, 10, 2.5, "9", True, None])
def test_a_bad_priority_is_refused(client: Client, priority: Any) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        client.submit("quick", "hello", priority=priority)
    assert caught.value.fields == ["priority"]


def _finish_order(client: Client, job_ids: list[str]) -> list[str]:
    with client.runtime.session() as s:
        return list(
            s.exec(
                select(Turn.id).where(col(Turn.id).in_(job_ids)).order_by(col(Turn.finished_at))
            ).all()
        )


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


@pytest.mark.long
def test_an_interactive_job_overtakes_a_backlog_of_batch_jobs(private: Private) -> None:
    # Given a fleet of one worker slot, busy with a batch job held at a gate
    settings, client = private()
    worker = WorkerProcess(
        settings, "one-slot", "-Q", "llm,control", "-P", "threads", "-c", "1", "--without-mingle"
    )
    gate = uuid.uuid4().hex
    with running(worker, client=client):
        first = client.submit("gated", f"{gate} b0", priority=0)
        _wait_for(gate_path(settings.state_dir, f"{gate}-started"))
        # When three more batch jobs queue up, then one interactive job
        backlog = [client.submit("gated", f"{gate} b{i}", priority=0) for i in range(1, 4)]
        urgent = client.submit("gated", f"{gate} urgent", priority=9)
        gate_path(settings.state_dir, gate).touch()
        answers = [job.result(timeout=60) for job in [first, *backlog, urgent]]

    # Then every job answered, and the interactive one finished right after
    # the job the worker already held, before the whole backlog
    assert answers == [f"done b{i}" for i in range(4)] + ["done urgent"]
    order = _finish_order(client, [first.id, *(j.id for j in backlog), urgent.id])
    assert order[:2] == [first.id, urgent.id]
    assert order[2:] == [j.id for j in backlog]  # the backlog in its own order


@pytest.mark.long
def test_every_task_of_a_job_tree_carries_its_priority(
    private: Private, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker of every queue that records the broker priority of each
    # task it runs (one process: a second would only add its start-up)
    monkeypatch.setenv(RECORD_PRIORITIES, "1")
    settings, client = private()
    worker = WorkerProcess(
        settings, "rec", "-Q", "llm,control,tools", "-P", "threads", "-c", "8", "--without-mingle"
    )
    with running(worker, client=client):
        # When a job with a tool call and a subagent (itself calling a tool)
        # runs at priority 8
        job = client.submit("busy-lead", "go", priority=8)
        job.result(timeout=90)
        with client.runtime.session() as s:
            convs = s.exec(select(Conversation).where(Conversation.root_id == job.root_id)).all()
    records = [
        json.loads(r)
        for r in client.runtime.redis.lrange(f"{settings.redis_prefix}:priorities", 0, -1)  # type: ignore[union-attr]
    ]

    # Then the tree's conversations hold it, and every task of the tree (both
    # conversations' steps, every tool call, every advance) was delivered with
    # kombu's priority 1 (kombu takes 0 first; a job's 9 is its highest).
    # Only the dequeue, which starts the conversation's next message rather
    # than serving this job, is sent without one.
    assert len(convs) == 2 and {c.priority for c in convs} == {8}
    job_tasks = [r for r in records if r["task"] != "chorus.dequeue"]
    assert {r["task"] for r in job_tasks} == {"chorus.step", "chorus.tool", "chorus.advance"}
    assert sum(r["task"] == "chorus.step" for r in job_tasks) == 4  # 2 steps a conversation
    assert {r["priority"] for r in job_tasks} == {1}


def test_the_sweeper_sees_a_task_in_its_priority_list_and_re_sends_it_there(
    private: Private,
) -> None:
    # Given a step of a priority-7 job waiting in a queue no worker consumes
    _settings, client = private(stall_timeout=1.0)
    job = client.submit("quick", "waiting", priority=7)
    key = f"{client.settings.redis_prefix}:llm\x06\x162"  # kombu's list of its priority 2
    store = client.runtime.redis
    assert store.llen(key) == 1
    sweeper = Sweeper(client)

    # When the sweeper runs for several stall timeouts
    end = time.monotonic() + 3
    while time.monotonic() < end:
        sweeper.once()
        time.sleep(0.2)
    # Then it sent nothing: the task is late, not lost
    assert sweeper.sent == []

    # When the message is lost
    store.delete(key)
    deadline = time.monotonic() + 20
    while not sweeper.once():
        assert time.monotonic() < deadline, "the lost step was never re-sent"
        time.sleep(0.2)
    # Then the sweeper re-sent the step, with the job's priority
    assert store.llen(key) == 1
    assert client.job(job.id).status().status.value == "running"
