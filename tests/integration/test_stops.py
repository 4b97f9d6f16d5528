"""Stopping a job while its tree runs: cancel and the wall-time budget (issue 8, items 7, 10)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from sqlalchemy import update
from sqlmodel import col, select

from orchestrator import Client, Job, JobFailedError
from orchestrator.store.tables import Conversation, ToolCallRow, Turn
from schemas import Budget, EventName, JobStatus, TurnStatus
from tests.conftest import WorkerProcess, tool_calls

pytestmark = pytest.mark.integration


def _ended(job: Job, timeout: float = 60) -> JobStatus:
    deadline = time.monotonic() + timeout
    while not (status := job.status()).status.finished:
        assert time.monotonic() < deadline, f"job {job.id} never ended"
        time.sleep(0.1)
    return status


def _assert_tree_at_rest(client: Client, job: Job) -> None:
    """Every turn of the tree ended, every conversation idle, every call finished."""
    with client.runtime.session() as s:
        turns = s.exec(select(Turn).where(Turn.root_id == job.root_id)).all()
        states = s.exec(select(Conversation.state).where(Conversation.root_id == job.root_id))
        calls = s.exec(
            select(ToolCallRow.status).where(col(ToolCallRow.turn_id).in_([t.id for t in turns]))
        ).all()
    assert all(t.status != "running" for t in turns)
    assert set(states) == {"idle"}
    assert set(calls) <= {"completed", "failed", "cancelled"}


def _wait_busy(client: Client, job: Job) -> None:
    """Until children of the job are running."""
    deadline = time.monotonic() + 60
    while True:
        with client.runtime.session() as s:
            children = s.exec(
                select(Turn).where(Turn.job_id == job.id, col(Turn.parent_call_id).is_not(None))
            ).all()
        if children:
            return
        assert time.monotonic() < deadline, "the tree never got busy"
        time.sleep(0.05)


def test_cancels_at_random_moments_of_a_fan_out_all_end_cancelled(
    client: Client, workers: Any
) -> None:
    # Given five jobs, each fanning out to children that run tools and steps
    rng = random.Random(8)
    jobs = [client.submit("stoppable-lead", f"run {i}") for i in range(5)]
    failures: list[BaseException] = []

    def cancel_later(job: Job, delay: float) -> None:
        time.sleep(delay)
        try:
            job.cancel()
        except BaseException as exc:  # any error at all fails the test
            failures.append(exc)

    # When each is cancelled at a random moment, concurrently with the others
    threads = [
        threading.Thread(target=cancel_later, args=(job, rng.uniform(0.3, 2.0))) for job in jobs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # Then no cancel failed, and every job ended cancelled with its whole tree at rest
    assert failures == []
    for job in jobs:
        assert _ended(job, timeout=10).status is TurnStatus.CANCELLED
        _assert_tree_at_rest(client, job)
        names = [e.name for e in job.events(deltas=False, timeout=5)]
        assert names[-1] is EventName.TURN_CANCELLED
        assert names.count(EventName.TURN_CANCELLED) + names.count(
            EventName.TURN_COMPLETED
        ) == names.count(EventName.TURN_STARTED)


def test_a_stop_whose_process_died_after_marking_is_finished_by_the_sweeper(
    client: Client, workers: Any
) -> None:
    # Given a busy tree whose cancel died right after marking the job stopping
    job = client.submit("stoppable-lead", "run")
    _wait_busy(client, job)
    with client.runtime.session() as s:
        s.execute(
            update(Turn)
            .where(col(Turn.id) == job.id)
            .values(stop_status="cancelled", stop_reason="cancelled")
        )

    # When the sweeper runs
    client.celery.send_task("chorus.sweep", queue="control").get(timeout=30)

    # Then the stop is finished: the job ends cancelled, its tree at rest
    assert _ended(job, timeout=20).status is TurnStatus.CANCELLED
    _assert_tree_at_rest(client, job)


def _stopped_tool_logged(worker: WorkerProcess) -> bool:
    return "stopped: its job is being stopped" in worker.log_path.read_text(errors="replace")


def test_a_wall_time_budget_cuts_a_running_tool(
    client: Client, workers: dict[str, WorkerProcess]
) -> None:
    # Given a job with a 5 s wall-time budget whose model calls a 30 s tool
    # (on a warm fleet, so the model call is long done when the time is up)
    client.submit("quick", "warm up").result(timeout=60)
    began = time.monotonic()
    job = client.submit("overtime", "wait", budget=Budget(wall_seconds=5))

    # Then the job ends on its budget while the tool still runs, well before 30 s
    with pytest.raises(JobFailedError, match="wall time budget exceeded"):
        job.result(timeout=60)
    assert time.monotonic() - began < 20
    status = job.status()
    assert status.status is TurnStatus.FAILED
    assert status.error is not None and status.error.startswith("wall time budget exceeded: ")
    names = [e.name for e in job.events(deltas=False, timeout=5)]
    assert names.count(EventName.BUDGET_EXCEEDED) == 1
    assert names.count(EventName.TOOL_CANCELLED) == 1 and names[-1] is EventName.TURN_FAILED
    assert [c.status for c in tool_calls(client, job.id)] == ["cancelled"]
    # and the tool task let go of its worker slot (its function runs out in the background)
    deadline = time.monotonic() + 10
    while not _stopped_tool_logged(workers["tools"]):
        assert time.monotonic() < deadline, "the running tool never observed the stop"
        time.sleep(0.2)
