"""The sweeper's blind spots: a job past its wall-time budget among many,
a task in a queue no worker reads, a deferral longer than the broker's
visibility timeout, and workers whose wall clocks disagree.

Each test runs on its own Redis key prefix with its own worker processes
(the helpers of ``test_sweeper``).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlmodel import select

from orchestrator import Client, engine
from orchestrator.dispatch import dispatch
from orchestrator.engine.actions import RunSegment, RunStep
from orchestrator.errors import JobFailedError
from orchestrator.store.tables import Conversation, EventRow
from schemas import AgentSpec, Budget, EventName
from schemas.specs import RetryPolicy
from tests.conftest import WorkerProcess, worker_env
from tests.integration import test_sweeper
from tests.integration.test_sweeper import (
    ALONE,
    Private,
    Sweeper,
    _lists,
    _model_calls_per_step,
    running,
    sweeping,
)
from tests.test_cli import run

pytestmark = pytest.mark.integration

#: Settings and a client on a fresh key prefix: the sweeper tests' fixture.
private = test_sweeper.private


def _status(client: Client, job_id: str) -> str:
    return client.job(job_id).status().status.value


def test_a_spent_wall_budget_is_reached_past_the_sweeps_read_limit(private: Private) -> None:
    # Given no worker on this prefix, five jobs with an hour of wall time,
    # then one with half a second (its deadline task is never run)
    _settings, client = private()
    hour = [client.submit("quick", f"h{i}", budget=Budget(wall_seconds=3600)) for i in range(5)]
    short = client.submit("quick", "short", budget=Budget(wall_seconds=0.5))
    time.sleep(1.0)

    # When a sweep reads at most five jobs
    engine.sweep(client.runtime, limit=5)

    # Then the spent job was stopped, and the others still run
    with pytest.raises(JobFailedError, match="wall time budget exceeded"):
        short.result(timeout=10)
    assert [_status(client, j.id) for j in hour] == ["running"] * 5


@pytest.mark.long
def test_a_call_in_a_queue_no_worker_reads_is_reported_and_fails_its_turn(
    private: Private,
) -> None:
    # Given a worker on every Chorus queue, and an agent whose tool is routed
    # to a queue that no worker reads
    settings, client = private(stall_timeout=1.0, max_redispatches=2)
    llm = WorkerProcess(
        settings, "unread", "-Q", "llm,control,tools", "-P", "threads", "-c", "4", ALONE
    )
    with running(llm, client=client):
        job = client.submit("unread-queue", "go")
        deadline = time.monotonic() + 45
        while not any(client.runtime.redis.llen(k) for k in _lists(client, "nobody-reads")):
            assert time.monotonic() < deadline, "the call was never sent"
            time.sleep(0.1)
        # (`chorus queues` runs meanwhile: the call waits until the turn fails)
        shown: list[str] = []
        cli = threading.Thread(
            target=lambda: shown.append(run(["queues"], worker_env(settings)).stdout)
        )
        cli.start()

        # When the sweeper runs while the call waits
        sweeper = Sweeper(client)
        while _status(client, job.id) == "running":
            assert time.monotonic() < deadline, "the turn never ended"
            sweeper.once()
            time.sleep(0.3)
        cli.join(60)
        assert shown, "`chorus queues` did not answer"

    # Then `chorus queues` flagged the queue, each sweep that found the call
    # said where it waits (never re-sending it), and the turn failed naming it
    lines = {line.split()[0]: line for line in shown[0].splitlines() if line.strip()}
    assert "readers=0" in lines["nobody-reads"]
    assert "no worker reads this queue" in lines["nobody-reads"]
    assert "readers=1" in lines["llm"] and "no worker" not in lines["llm"]
    with pytest.raises(JobFailedError, match="queue 'nobody-reads', which no worker reads"):
        job.result(timeout=5)
    unread = [e for e in job.events(timeout=5) if e.name is EventName.QUEUE_UNREAD]
    assert [e.data["queues"] for e in unread] == [["nobody-reads"]] * 2
    conversation_id = job.status().conversation_id
    resent = [a for a in sweeper.sent if isinstance(a, RunSegment | RunStep)]
    assert not [a for a in resent if a.conversation_id == conversation_id]


@pytest.mark.long
def test_a_deferral_longer_than_the_visibility_timeout_is_held_in_pieces(
    private: Private, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a visibility timeout of 4 s, and a model call that fails once
    # and is retried after 7 s (retry-later's script, its delay shortened)
    monkeypatch.setenv("CHORUS_VISIBILITY_TIMEOUT", "4")
    settings, client = private(visibility_timeout=4, stall_timeout=3.0)
    llm = WorkerProcess(settings, "held", "-Q", "llm,control", "-P", "threads", "-c", "4", ALONE)
    agent = AgentSpec(
        name="retry-later",
        model="scripted/retry-later",
        retry=RetryPolicy(initial_delay=7.0, jitter=0.0, max_attempts=3),
    )
    held: list[float] = []
    with running(llm, client=client), sweeping(client) as sweeper:
        # When the retry waits, its task held by the worker until its countdown
        job = client.submit(agent, uuid.uuid4().hex)
        while _status(client, job.id) == "running":
            replies = client.celery.control.inspect([llm.name], timeout=1.0).scheduled() or {}
            now = datetime.now(UTC)
            for entry in replies.get(llm.name, []):
                held.append((datetime.fromisoformat(entry["eta"]) - now).total_seconds())
            time.sleep(0.5)
        answer = job.result(timeout=5)

    # Then no task was held longer than half the visibility timeout, the
    # retry still ran when due (not at the first early copy), once, and the
    # sweeper sent nothing
    assert answer == "recovered"
    assert held, "no held task was seen"
    assert max(held) <= 2.0 + 0.5, f"a task was held {max(held):.1f}s ahead"
    events = list(job.events(deltas=False, timeout=5))
    failed = [e for e in events if e.name is EventName.LLM_FAILED]
    requested = [e for e in events if e.name is EventName.LLM_REQUESTED]
    assert len(failed) == 1 and len(requested) == 2
    waited = (requested[1].time - failed[0].time).total_seconds()
    assert waited >= 6.5, f"the retry ran after {waited:.1f}s, before it was due"
    assert sweeper.sent_for(job.conversation_id) == []


def _faketime() -> str | None:
    for path in Path("/usr/lib").glob("*/faketime/libfaketime.so.1"):
        return str(path)
    return None


@pytest.mark.skipif(_faketime() is None, reason="libfaketime is not installed")
def test_a_worker_whose_clock_runs_ahead_neither_sweeps_nor_takes_a_live_lease(
    private: Private,
) -> None:
    # Given a worker taking model calls one at a time, and a second worker,
    # its clock five minutes ahead, that runs the sweeps (its model client
    # loaded: it starts on the model queue too, then leaves it)
    settings, client = private(stall_timeout=3.0)
    llm = WorkerProcess(settings, "clock-llm", "-Q", "llm", "-P", "threads", "-c", "1", ALONE)
    ahead = {
        "LD_PRELOAD": str(_faketime()),
        "FAKETIME": "+300",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }
    os.environ.update(ahead)
    try:
        skewed = WorkerProcess(settings, "clock-ahead", "-Q", "llm,control", "-P", "threads", ALONE)
    finally:
        for key in ahead:
            os.environ.pop(key)
    control = client.celery.control
    with running(llm, skewed, client=client):
        control.cancel_consumer("llm", destination=[skewed.name], reply=True)

        # When a model call of 8 s holds its lease on the first worker
        job = client.submit("long-call", "8")
        conversation_id = job.status().conversation_id
        deadline = time.monotonic() + 30
        while _lease_owner(client, conversation_id) is None:
            assert time.monotonic() < deadline, "the step never took its lease"
            time.sleep(0.1)
        # and the skewed worker sweeps, then reads the model queue again and
        # gets a second copy of the step
        client.celery.send_task("chorus.sweep", queue="control").get(timeout=30)
        with client.runtime.session() as session:
            conv = session.get(Conversation, conversation_id)
            assert conv is not None
            swept = conv.redispatches
        control.add_consumer("llm", destination=[skewed.name], reply=True)
        dispatch(client.celery, [RunStep(conversation_id, job.id, 0, 5)])
        answer = job.result(timeout=60)

    # Then the sweep took the position for neither stalled nor its lease for
    # expired, and the model was called once
    assert swept == 0, "the sweeper re-dispatched a live step"
    assert answer == "took my time"
    assert _model_calls_per_step(client, [job.id]) == [1]
    with client.runtime.session() as session:
        usage = session.exec(
            select(EventRow).where(
                EventRow.turn_id == job.id, EventRow.name == EventName.USAGE.value
            )
        ).all()
    assert not [e for e in usage if (e.data or {}).get("superseded")]


def _lease_owner(client: Client, conversation_id: str) -> str | None:
    with client.runtime.session() as session:
        conv = session.get(Conversation, conversation_id)
        return conv.lease_owner if conv is not None else None
