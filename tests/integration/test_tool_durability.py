"""Tool calls under stops, crashes and repeated provider ids (issue 21, items 5, 10, 17)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlmodel import col, select

from orchestrator import Client, Job, Settings
from orchestrator.store.tables import EventRow, ToolCallRow, Turn
from schemas import EventName, TurnStatus
from tests.conftest import WorkerProcess, tool_calls

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cut_worker(settings: Settings, client: Client) -> Iterator[WorkerProcess]:
    """A threads worker (the default tools pool) of the ``cut`` queue."""
    worker = WorkerProcess(settings, "cut", "-Q", "cut", "-P", "threads", "-c", "8")
    try:
        worker.wait_ready(client)
        yield worker
    finally:
        worker.stop()


def _until(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _tree_calls(client: Client, job: Job) -> list[ToolCallRow]:
    with client.runtime.session() as s:
        turns = s.exec(select(Turn.id).where(Turn.root_id == job.root_id)).all()
        calls = list(s.exec(select(ToolCallRow).where(col(ToolCallRow.turn_id).in_(turns))).all())
        s.expunge_all()
    return calls


def _events(client: Client, job: Job) -> list[tuple[str, dict[str, Any]]]:
    """The tree's stored events, read as rows (a follower waits for every
    older transaction of the cluster, which a shared server may hold open)."""
    with client.runtime.session() as s:
        rows = s.exec(
            select(EventRow.name, EventRow.data)
            .where(EventRow.root_id == job.root_id)
            .order_by(col(EventRow.seq))
        ).all()
    return [(name, data) for name, data in rows]


def _event_names(client: Client, job: Job) -> list[str]:
    return [name for name, _ in _events(client, job)]


def test_cancel_cuts_tools_running_in_a_threads_worker(
    client: Client, workers: Any, cut_worker: WorkerProcess
) -> None:
    # (The issue's report: a cancel sent once a follower saw both tools'
    # tool.started found them completed. tool.started is stored with the
    # result, so it was seen only then; the stop itself reaches tools in a
    # threads pool, which this guards: the shared tools worker is prefork.)
    # Given a job whose root runs a 30 s tool beside a subagent running
    # another, both in a threads worker
    job = client.submit("cut-lead", "work")
    _until(
        lambda: (
            [c.status for c in _tree_calls(client, job) if c.tool == "cut_sleep"]
            == ["running", "running"]
        ),
        "both tools never ran",
    )
    stops_before = cut_worker.log_path.read_text(errors="replace").count("being stopped")

    # When the job is cancelled right after both tools started
    job.cancel()

    # Then both running calls are recorded cancelled, the subagent stopped,
    # and no tool completed
    assert job.status().status is TurnStatus.CANCELLED
    names = _event_names(client, job)
    assert names.count(EventName.TOOL_CANCELLED.value) == 2, names
    assert names.count(EventName.SUBAGENT_STOPPED.value) == 1, names
    assert names.count(EventName.TURN_CANCELLED.value) == 2, names
    assert EventName.TOOL_COMPLETED.value not in names, names
    # and both tool tasks left their worker well before their tools' end
    _until(
        lambda: (
            cut_worker.log_path.read_text(errors="replace").count("being stopped")
            >= stops_before + 2
        ),
        "the running tools never observed the stop",
        timeout=15,
    )
    assert sorted(c.status for c in _tree_calls(client, job)) == ["cancelled"] * 3


def test_a_result_after_the_stop_mark_is_dropped_and_the_call_cancelled(
    client: Client, workers: dict[str, WorkerProcess]
) -> None:
    # Given a job running a 4 s tool whose stop marked the job and went no
    # further (its process died before setting the flag and ending the turn)
    job = client.submit("sleepy-child", "nap")
    _until(
        lambda: [c.status for c in _tree_calls(client, job)] == ["running"], "the tool never ran"
    )
    (call,) = _tree_calls(client, job)
    with client.runtime.session() as s:
        s.execute(
            update(Turn)
            .where(col(Turn.id) == job.id)
            .values(stop_status="cancelled", stop_reason="cancelled")
        )

    # When the tool returns and its task ends
    _until(
        lambda: f"chorus.tool[{call.id}] succeeded" in workers["tools"].log_path.read_text(),
        "the tool task never ended",
    )

    # Then its result was not recorded: the mark wins
    assert [c.status for c in _tree_calls(client, job)] == ["running"]
    assert EventName.TOOL_COMPLETED.value not in _event_names(client, job)

    # and finishing the stop records the call cancelled
    job.cancel()
    assert job.status().status is TurnStatus.CANCELLED
    names = _event_names(client, job)
    assert names.count(EventName.TOOL_CANCELLED.value) == 1, names
    assert EventName.TOOL_COMPLETED.value not in names, names


def test_a_tool_that_kills_its_process_ends_with_an_error_after_its_attempts(
    client: Client, workers: Any, tmp_path: Path
) -> None:
    # Given a model calling, beside an ordinary tool, a tool that SIGKILLs its
    # prefork child every time (redelivered at once: reject on worker lost)
    runs = tmp_path / "runs"
    job = client.submit("crasher", "go", context_data={"runs": str(runs)})

    # Then the turn goes on and completes after CHORUS_MAX_TOOL_ATTEMPTS (3) runs
    answer = job.result(timeout=120)
    assert len(runs.read_text().split()) == 3
    crashed, added = tool_calls(client, job.id)
    assert crashed.is_error and crashed.status == "failed"
    assert "the tool's process died 3 times" in str(crashed.result)
    assert added.result == 5 and not added.is_error
    results = json.loads(answer.removeprefix("results: "))
    assert "the tool's process died 3 times" in results[0] and results[1] == 5
    failed = [d["tool"] for name, d in _events(client, job) if name == EventName.TOOL_FAILED]
    assert failed == ["crash_process"]
    # and no further copy runs it
    time.sleep(1.0)
    assert len(runs.read_text().split()) == 3


def test_tools_get_a_key_of_their_own_when_provider_ids_repeat(
    client: Client, workers: Any
) -> None:
    # Given a provider that numbers its calls per reply: three calls, two
    # steps, all with the provider id "call_0"
    job = client.submit("same-ids", "who")
    answer = job.result(timeout=60)

    # Then each call's ToolContext.tool_request_id is its own, Chorus's id of
    # the call, while the provider's id stays on the wire and in the events
    keys = [r["tool_request_id"] for r in json.loads(answer.removeprefix("results: "))]
    calls = tool_calls(client, job.id)
    assert len(set(keys)) == 3
    assert sorted(keys) == sorted(c.id for c in calls)
    assert {c.tool_request_id for c in calls} == {"call_0"}
    requested = [
        d["tool_request_id"] for name, d in _events(client, job) if name == EventName.TOOL_REQUESTED
    ]
    assert requested == ["call_0"] * 3
