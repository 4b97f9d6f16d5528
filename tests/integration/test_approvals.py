"""Durable human approvals on a real fleet: worker processes, Redis, Postgres, beat."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import ChorusError, Client, ConflictError, Job, JobFailedError, Settings
from schemas import Budget, EventName, PendingApproval, TurnStatus
from tests.approval_agents import stored_events
from tests.conftest import WorkerProcess, replace_tools_worker, tool_calls, worker_env
from tests.fleet import running_beat
from tests.test_cli import run

pytestmark = pytest.mark.integration


def _waiting(client: Client, job: Job, timeout: float = 30) -> PendingApproval:
    """The job's one call waiting for an answer, once it waits."""
    deadline = time.monotonic() + timeout
    while not (found := client.pending_approvals(conversation_id=job.conversation_id)):
        assert time.monotonic() < deadline, "no call started waiting"
        time.sleep(0.05)
    [waiting] = found
    return waiting


def _completed(client: Client, job: Job) -> None:
    """Until the job's (first) tool call completed."""
    deadline = time.monotonic() + 30
    while EventName.TOOL_COMPLETED not in _names(client, job):
        assert time.monotonic() < deadline, "no tool call completed"
        time.sleep(0.05)


def _runs(mark: Path) -> list[str]:
    return mark.read_text().splitlines() if mark.exists() else []


def _names(client: Client, job: Job) -> list[EventName]:
    return [e.name for e in stored_events(client, job)]


def test_approve_while_the_rest_of_the_segment_completes(
    client: Client, workers: Any, tmp_path: Path
) -> None:
    # Given lookup_city (1 s) and book_flight (approval=True) in one parallel segment
    mark = tmp_path / "mark"
    job = client.submit("travel-desk", "book Lisbon", context_data={"mark": str(mark)})
    waiting = _waiting(client, job)
    assert (waiting.tool, waiting.arguments) == ("book_flight", {"flight": "LIS-123"})

    # Then the other call of the segment completes while book_flight waits,
    # and the segment's barrier (the chord's advance) does not move on
    _completed(client, job)
    time.sleep(1.0)  # the chord's advance ran by now
    assert _names(client, job).count(EventName.LLM_REQUESTED) == 1
    assert job.status().status is TurnStatus.RUNNING
    assert _runs(mark) == ["lookup_city Lisbon"]

    # When it is approved, it runs once and the turn ends
    client.approve(waiting.call_id, note="ok", by="alice")
    assert "booked LIS-123" in job.result(timeout=60)
    assert _runs(mark) == ["lookup_city Lisbon", "book_flight LIS-123"]
    names = _names(client, job)
    order = [n for n in names if n.startswith("tool.") and n != EventName.TOOL_REQUESTED]
    assert order.index(EventName.TOOL_APPROVAL_REQUESTED) < order.index(EventName.TOOL_APPROVED)
    [approved] = [e for e in job.events(deltas=False) if e.name is EventName.TOOL_APPROVED]
    assert approved.data["by"] == "alice"


def test_deny_and_list_from_the_cli(settings: Settings, client: Client, workers: Any) -> None:
    env = worker_env(settings)
    job = client.submit("travel-desk", "book")
    waiting = _waiting(client, job)

    listed = run(["approvals", "--json", "--conversation", job.conversation_id], env)
    assert listed.returncode == 0, listed.stderr
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (row["call_id"], row["tool"]) == (waiting.call_id, "book_flight")

    denied = run(["deny", waiting.call_id, "--reason", "not today", "--by", "ops"], env)
    assert denied.returncode == 0, denied.stderr
    assert "was not run: denied: not today" in job.result(timeout=60)

    again = run(["approve", waiting.call_id], env)
    assert again.returncode == 2
    assert "already denied by 'ops'" in again.stderr and "Traceback" not in again.stderr


def _answer(
    client: Client, call_id: str, who: str, start: threading.Barrier, outcomes: dict[str, str]
) -> None:
    """alice approves, bob denies, both at the barrier's release."""
    start.wait()
    try:
        if who == "alice":
            client.approve(call_id, by=who)
        else:
            client.deny(call_id, reason="no", by=who)
        outcomes[who] = "won"
    except ConflictError:
        outcomes[who] = "conflict"
    except ChorusError as exc:  # anything else fails the test
        outcomes[who] = repr(exc)


def test_two_people_answering_at_once_one_wins(
    client: Client, workers: Any, tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    for round_ in range(3):
        # Given a waiting call, and two people answering it at the same moment
        job = client.submit("travel-desk", f"book {round_}", context_data={"mark": str(mark)})
        waiting = _waiting(client, job)
        before = _runs(mark).count("book_flight LIS-123")
        outcomes: dict[str, str] = {}
        start = threading.Barrier(2)
        threads = [
            threading.Thread(target=_answer, args=(client, waiting.call_id, who, start, outcomes))
            for who in ("alice", "bob")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)

        # Then one wins, the other gets a ConflictError, and one answer is recorded
        assert sorted(outcomes.values()) == ["conflict", "won"], outcomes
        result = job.result(timeout=60)
        answers = [
            e
            for e in job.events(deltas=False)
            if e.name in (EventName.TOOL_APPROVED, EventName.TOOL_DENIED)
        ]
        winner = next(who for who, outcome in outcomes.items() if outcome == "won")
        assert [e.data["by"] for e in answers] == [winner]
        # and the call ran once if the approval won, never otherwise
        ran = _runs(mark).count("book_flight LIS-123") - before
        assert ran == (1 if winner == "alice" else 0)
        assert ("booked LIS-123" in result) == (winner == "alice")


def test_cancel_while_waiting(client: Client, workers: Any, tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    job = client.submit("travel-desk", "book", context_data={"mark": str(mark)})
    waiting = _waiting(client, job)

    client.cancel(job.id)

    assert job.status().status is TurnStatus.CANCELLED
    [call] = [c for c in tool_calls(client, job.id) if c.tool == "book_flight"]
    assert call.status == "cancelled"
    assert EventName.TOOL_CANCELLED in _names(client, job)
    with pytest.raises(ConflictError):
        client.approve(waiting.call_id)
    time.sleep(0.5)
    assert "book_flight LIS-123" not in _runs(mark)


def test_a_wait_past_its_timeout_is_denied(
    settings: Settings, client: Client, workers: Any
) -> None:
    # Given beat (the sweeper) and an agent whose calls wait at most 2 s
    with running_beat(settings):
        job = client.submit("refund-desk", "refund 40")
        _waiting(client, job)

        # Then, unanswered, the call is denied and the model told why
        answer = job.result(timeout=60)
    assert "Error: tool 'issue_refund' was not run: denied: no answer in 2 s" in answer
    [denied] = [e for e in job.events(deltas=False) if e.name is EventName.TOOL_DENIED]
    assert denied.data["by"] == "chorus"


def test_a_worker_killed_while_a_call_waits(
    settings: Settings, client: Client, workers: dict[str, WorkerProcess], tmp_path: Path
) -> None:
    # Given a call waiting for approval (its tool task ran on the tools worker and ended)
    mark = tmp_path / "mark"
    job = client.submit("travel-desk", "book", context_data={"mark": str(mark)})
    waiting = _waiting(client, job)
    _completed(client, job)  # lookup_city: nothing runs on the worker but the wait

    # When the whole tools worker is SIGKILLed, the call is approved while no
    # worker reads its queue, and another worker starts
    os.killpg(workers["tools"].proc.pid, signal.SIGKILL)
    workers["tools"].proc.wait(10)
    client.approve(waiting.call_id)
    replace_tools_worker(settings, client, workers, "tools3")

    # Then the approval runs the call, once
    assert "booked LIS-123" in job.result(timeout=60)
    assert _runs(mark).count("book_flight LIS-123") == 1
    [call] = [c for c in tool_calls(client, job.id) if c.tool == "book_flight"]
    assert (call.status, call.attempts) == ("completed", 1)


def test_a_json_schema_tool_that_needs_approval_waits_then_runs(
    client: Client, workers: Any, tmp_path: Path
) -> None:
    # Given an agent whose JSON-schema tool is declared with approval=True
    mark = tmp_path / "mark"
    job = client.submit("cancel-desk", "cancel BK-7", context_data={"mark": str(mark)})
    # Then its call waits with the arguments the model sent, and does not run
    waiting = _waiting(client, job)
    assert (waiting.tool, waiting.arguments) == ("cancel_booking", {"booking": "BK-7"})
    time.sleep(0.5)
    assert _runs(mark) == [] and job.status().status is TurnStatus.RUNNING
    [asked] = stored_events(client, job, EventName.TOOL_APPROVAL_REQUESTED)
    assert asked.data["tool"] == "cancel_booking"
    # When it is approved, it runs once and the model gets its result
    client.approve(waiting.call_id, by="carol")
    assert "cancelled BK-7" in job.result(timeout=60)
    assert _runs(mark) == ["cancel_booking BK-7"]


def test_a_spent_wall_time_budget_ends_a_waiting_call_like_a_running_one(
    settings: Settings, client: Client, workers: Any, tmp_path: Path
) -> None:
    # Given beat (the sweeper) and a job of 2 s wall time whose call waits for a person
    mark = tmp_path / "mark"
    with running_beat(settings):
        job = client.submit(
            "travel-desk",
            "book",
            context_data={"mark": str(mark)},
            budget=Budget(wall_seconds=2),
        )
        waiting = _waiting(client, job)
        # When its budget is spent while nobody answers
        with pytest.raises(JobFailedError, match="budget"):
            job.result(timeout=60)
    # Then the job ends on its budget, the waiting call is cancelled (not
    # denied, not left waiting), and a late approval runs nothing
    assert job.status().status is TurnStatus.FAILED
    names = _names(client, job)
    assert EventName.BUDGET_EXCEEDED in names and EventName.TOOL_CANCELLED in names
    [call] = [c for c in tool_calls(client, job.id) if c.tool == "book_flight"]
    assert call.status == "cancelled"
    assert client.pending_approvals(conversation_id=job.conversation_id) == []
    with pytest.raises(ConflictError):
        client.approve(waiting.call_id)
    time.sleep(0.5)
    assert "book_flight LIS-123" not in _runs(mark)
