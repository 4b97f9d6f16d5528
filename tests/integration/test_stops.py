"""Stopping a job while its tree runs: cancel and the wall-time budget (issue 8, items 7, 10)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from sqlalchemy import text, update
from sqlmodel import col, select

from orchestrator import Client, Job, JobFailedError, engine
from orchestrator.dispatch import dispatch
from orchestrator.engine.actions import Deadline
from orchestrator.engine.cancel import stop_tree
from orchestrator.store.tables import Conversation, ToolCallRow, Turn, utcnow
from schemas import Budget, EventName, JobRequest, JobStatus, TurnStatus
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


@pytest.mark.parametrize("agent", ["stoppable-lead", "swarm-lead"])
def test_cancels_at_random_moments_of_a_fan_out_all_end_cancelled(
    client: Client, workers: Any, agent: str
) -> None:
    # Given eight jobs, each fanning out to children that run tools and steps
    rng = random.Random(8)
    jobs = [client.submit(agent, f"run {i}") for i in range(8)]
    failures: list[BaseException] = []

    def cancel_later(job: Job, delay: float) -> None:
        time.sleep(delay)
        try:
            job.cancel()
        except BaseException as exc:  # any error at all fails the test
            failures.append(exc)

    # When each is cancelled at a random moment, concurrently with the others
    threads = [
        threading.Thread(target=cancel_later, args=(job, rng.uniform(0.2, 2.0))) for job in jobs
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


def _lock_waiters(client: Client) -> int:
    """Transactions waiting for a row lock (asked on a fresh connection:
    pg_stat_activity is a snapshot per transaction)."""
    with client.runtime.session() as s:
        return int(
            s.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            ).scalar_one()
        )


def _blocked_by(client: Client, holder: Any) -> int:
    """Transactions waiting for a lock the ``holder`` session holds."""
    pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
    with client.runtime.session() as s:
        return int(
            s.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
                ),
                {"pid": pid},
            ).scalar_one()
        )


def _until(condition: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_cancel_meeting_steps_that_wait_on_the_job_turn_does_not_deadlock(
    client: Client, workers: Any
) -> None:
    # Given children whose steps are storing their replies, held up on the job's
    # turn (another step's usage roll-up holds it)
    logged = _log_ends(workers)
    job = client.submit("stoppable-lead", "run")
    _wait_busy(client, job)
    with client.runtime.session() as other_step:
        other_step.execute(
            text("SELECT id FROM chorus_turn WHERE id = :id FOR UPDATE"), {"id": job.id}
        )
        _until(lambda: _lock_waiters(client) >= 1, "no step reached the job's turn")
        waiting = _lock_waiters(client)

        # When the job is cancelled meanwhile
        failures: list[BaseException] = []

        def cancel() -> None:
            try:
                job.cancel()
            except BaseException as exc:  # any error at all fails the test
                failures.append(exc)

        canceller = threading.Thread(target=cancel)
        canceller.start()
        _until(lambda: _lock_waiters(client) > waiting, "the cancel never waited")
        # (the roll-up commits now)
    canceller.join(60)

    # Then neither the cancel nor a step lost a deadlock: the job ends cancelled
    assert failures == []
    assert _ended(job, timeout=20).status is TurnStatus.CANCELLED
    _assert_tree_at_rest(client, job)
    assert _deadlocks(workers, logged) == []


def _log_ends(workers: Any) -> dict[str, int]:
    """Where each worker's log ends now."""
    return {name: w.log_end() for name, w in workers.items()}


def _deadlocks(workers: Any, since: dict[str, int]) -> list[str]:
    """The deadlocks the workers logged after ``since`` (:func:`_log_ends`).
    (The ``workers`` fixture checks the whole session's.)"""
    return [line for name, w in workers.items() for line in w.deadlocks(since[name])]


def test_a_subagent_start_takes_the_root_row_before_its_call_so_a_stop_cannot_deadlock(
    client: Client, workers: Any
) -> None:
    # Given a job whose lead called a subagent, the child's start not picked up
    # yet (the llm worker does not consume control)
    llm = [workers["llm"].name]
    assert client.celery.control.cancel_consumer("control", destination=llm, reply=True)
    try:
        job = client.submit("spawner", "spawn 1")
        call = _pending_call(client, job)
        with client.runtime.session() as stop:
            # ... and a stop ending the lead's turn holds the root's row (as
            # cancel's end of the job's own turn does, then its calls)
            stop.execute(
                text("SELECT id FROM chorus_conversation WHERE id = :id FOR UPDATE"),
                {"id": job.root_id},
            )
            # When the child's start runs meanwhile
            assert client.celery.control.add_consumer("control", destination=llm, reply=True)
            _until(lambda: _blocked_by(client, stop) >= 1, "the child's start never waited")

            # Then it waits for the root's row without holding the call's
            # (holding it, each would wait for the other: a deadlock)
            stop.execute(
                text("SELECT id FROM chorus_tool_call WHERE id = :id FOR UPDATE NOWAIT"),
                {"id": call},
            )
    finally:
        client.celery.control.add_consumer("control", destination=llm, reply=True)
    assert job.result(timeout=30) == 'children: ["done k0"]'


def test_a_job_on_a_subagents_conversation_takes_the_root_row_before_its_turn(
    client: Client, workers: Any
) -> None:
    # Given a subagent's conversation, idle once its parent's job ended
    logged = _log_ends(workers)
    parent = client.submit("spawner", "spawn 1")
    parent.result(timeout=30)
    with client.runtime.session() as s:
        child = s.exec(
            select(Conversation.id).where(
                Conversation.root_id == parent.root_id, Conversation.agent == "echo-child"
            )
        ).one()
    with client.runtime.session() as stop:
        # ... and a stop holding the root's row (it writes the job's turn next)
        stop.execute(
            text("SELECT id FROM chorus_conversation WHERE id = :id FOR UPDATE"),
            {"id": parent.root_id},
        )
        # When a job runs on the subagent's conversation meanwhile
        job = client.submit("quick", "again", conversation_id=child)
        _until(lambda: _blocked_by(client, stop) >= 1, "the job's step never waited")

        # Then its step waits for the root's row without holding its turn's
        stop.execute(
            text("SELECT id FROM chorus_turn WHERE id = :id FOR UPDATE NOWAIT"), {"id": job.id}
        )
    assert job.result(timeout=30) == "ok: again"
    assert _deadlocks(workers, logged) == []


def _pending_call(client: Client, job: Job) -> str:
    """The id of the job's first tool call, once its step has stored it."""
    deadline = time.monotonic() + 30
    while True:
        with client.runtime.session() as s:
            found = s.exec(select(ToolCallRow.id).where(ToolCallRow.turn_id == job.id)).first()
        if found is not None:
            return found
        assert time.monotonic() < deadline, "the lead never called its subagent"
        time.sleep(0.05)


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


def test_the_sweeper_stops_a_job_past_its_deadline_whose_deadline_task_was_lost(
    client: Client, workers: Any
) -> None:
    # Given a job with a 3 s wall-time budget whose chorus.deadline task was lost
    ref, actions = engine.start_turn(
        client.runtime,
        JobRequest(agent="overtime", input="wait", budget=Budget(wall_seconds=3)),
    )
    assert any(isinstance(a, Deadline) for a in actions)
    dispatch(client.celery, [a for a in actions if not isinstance(a, Deadline)])
    job = client.job(ref.job_id)
    _until(lambda: [c.status for c in tool_calls(client, job.id)] == ["running"], "no tool ran")

    # When the sweeper runs after the deadline
    time.sleep(max(0.0, 3.5 - (time.monotonic() - _started(client, job))))
    client.celery.send_task("chorus.sweep", queue="control").get(timeout=30)

    # Then the job is stopped on its budget while its 30 s tool still runs
    status = _ended(job, timeout=10)
    assert status.status is TurnStatus.FAILED
    assert status.error is not None and status.error.startswith("wall time budget exceeded")
    assert [c.status for c in tool_calls(client, job.id)] == ["cancelled"]


def _started(client: Client, job: Job) -> float:
    """When the job's turn started, on this process's monotonic clock."""
    with client.runtime.session() as s:
        turn = s.get(Turn, job.id)
        assert turn is not None
        age = (utcnow() - turn.started_at).total_seconds()
    return time.monotonic() - age


def _at_once(*fns: Callable[[], object]) -> list[BaseException]:
    """Run ``fns`` in threads released at the same moment; what they raised."""
    start = threading.Barrier(len(fns))
    errors: list[BaseException] = []

    def run(fn: Callable[[], object]) -> None:
        start.wait()
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in fns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return errors


def test_a_cancel_racing_a_budget_stop_ends_the_job_one_way(client: Client) -> None:
    # Given 12 running jobs (started, their steps never sent: nothing else moves them)
    rt = client.runtime
    refs = [
        engine.start_turn(rt, JobRequest(agent="quick", input=f"race {i}"))[0] for i in range(12)
    ]
    ends = {EventName.TURN_CANCELLED, EventName.TURN_FAILED, EventName.TURN_COMPLETED}
    for ref in refs:
        # When a cancel and a budget stop of each start at the same moment
        errors = _at_once(
            partial(engine.cancel, rt, ref.job_id),
            partial(stop_tree, rt, ref.job_id, TurnStatus.FAILED, "cost exceeded", budget=True),
        )

        # Then the first mark wins: one end, and budget.exceeded only with a budget end
        assert errors == []
        job = client.job(ref.job_id)
        names = [e.name for e in job.events(deltas=False, timeout=5)]
        status = job.status().status
        if status is TurnStatus.CANCELLED:
            assert [n for n in names if n in ends] == [EventName.TURN_CANCELLED]
            assert EventName.BUDGET_EXCEEDED not in names
        else:
            assert status is TurnStatus.FAILED, status
            assert [n for n in names if n in ends] == [EventName.TURN_FAILED]
            assert names.count(EventName.BUDGET_EXCEEDED) == 1
        _assert_tree_at_rest(client, job)
