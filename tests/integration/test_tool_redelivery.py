"""A redelivered copy of a tool task never records a second result (issue 8, item 6)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import select

from orchestrator import Client
from orchestrator.store.tables import EventRow, ToolCallRow, Turn
from schemas import EventName
from tests.conftest import tool_calls

pytestmark = pytest.mark.integration


def _redeliver(client: Client, call_id: str) -> Any:
    """Send another copy of the call's ``chorus.tool`` task, as Redis would."""
    return client.celery.send_task("chorus.tool", args=(call_id,), queue="tools")


def _wait_call(client: Client, job_id: str, position: int, status: str) -> ToolCallRow:
    deadline = time.monotonic() + 60
    while True:
        calls = tool_calls(client, job_id)
        if len(calls) > position and calls[position].status == status:
            return calls[position]
        assert time.monotonic() < deadline, f"call {position} never became {status}"
        time.sleep(0.05)


def _ended(client: Client, root_id: str, request_id: str) -> list[str]:
    """Names of the stored tool.completed / tool.failed events of one call."""
    with client.runtime.session() as s:
        rows = s.exec(select(EventRow).where(EventRow.root_id == root_id)).all()
    return [
        r.name
        for r in rows
        if r.name in (EventName.TOOL_COMPLETED.value, EventName.TOOL_FAILED.value)
        and r.data.get("tool_request_id") == request_id
    ]


def _waiting_on_a_call(client: Client) -> bool:
    """Is some transaction waiting for a tool call row's lock? (Asked on a
    fresh connection: pg_stat_activity is a snapshot per transaction.)"""
    with client.runtime.session() as s:
        return bool(
            s.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query ILIKE 'UPDATE chorus_tool_call%'"
                )
            ).scalar_one()
        )


def test_copies_of_a_finished_tool_task_leave_it_alone(client: Client, workers: Any) -> None:
    # Given a batch whose fast call has finished while its slow sibling still runs
    job = client.submit("redeliver", "add and wait")
    done = _wait_call(client, job.id, 0, "completed")

    # When copies of the finished call's task arrive, during the turn and after it
    for copy in [_redeliver(client, done.id) for _ in range(3)]:
        copy.get(timeout=30)
    answer = job.result(timeout=60)
    _redeliver(client, done.id).get(timeout=30)

    # Then the call still has its one result, one attempt and one tool.completed
    again = tool_calls(client, job.id)[0]
    assert (again.status, again.result, again.attempts) == ("completed", 3, 1)
    assert again.finished_at == done.finished_at
    assert _ended(client, job.root_id, done.tool_request_id) == ["tool.completed"]
    assert answer.startswith("results: [3, ")


def test_a_copy_that_read_the_call_unfinished_cannot_reopen_it(
    client: Client, workers: Any
) -> None:
    # Given a running call, whose first copy is recording its result (row locked,
    # not yet committed)
    job = client.submit("redeliver", "add and wait")
    slow = _wait_call(client, job.id, 1, "running")
    with client.runtime.session() as first:
        first.execute(
            text(
                "UPDATE chorus_tool_call SET status = 'completed', result = '\"first\"', "
                "finished_at = now() WHERE id = :id"
            ),
            {"id": slow.id},
        )
        # When a redelivered copy reads the call as running and tries to claim it
        copy = _redeliver(client, slow.id)
        deadline = time.monotonic() + 30
        while not _waiting_on_a_call(client):
            assert time.monotonic() < deadline, "the copy never reached its claim"
            time.sleep(0.05)
        # (the first copy's result commits now)
    copy.get(timeout=30)

    # Then the copy left: the call keeps the first result and was claimed once
    job.result(timeout=60)
    call = tool_calls(client, job.id)[1]
    assert (call.status, call.result, call.attempts) == ("completed", "first", 1)
    assert _ended(client, job.root_id, slow.tool_request_id) == []  # none from the copy


def test_a_copy_of_a_subagent_start_whose_child_runs_starts_no_second_child(
    client: Client, workers: Any
) -> None:
    # Given a lead whose subagent call has started its child, still running
    job = client.submit("busy-lead", "go")
    call = _wait_call(client, job.id, 1, "running")
    assert call.tool == "subagent__sleepy-child"

    # When a copy of the call's task is delivered again, as Redis would
    client.celery.send_task(
        "chorus.tool", args=(call.id,), kwargs={"subagent": True}, queue="tools"
    )
    deadline = time.monotonic() + 30
    while tool_calls(client, job.id)[1].attempts < 2:  # the copy claimed it, and went on
        assert time.monotonic() < deadline, "the copy never ran"
        time.sleep(0.05)

    # Then the turn ends as usual, with one child and one slot taken for it
    assert "child" in job.result(timeout=60)
    with client.runtime.session() as s:
        children = s.exec(select(Turn.id).where(Turn.parent_call_id == call.id)).all()
        taken = s.exec(select(Turn.tree_children).where(Turn.id == job.id)).one()
    assert len(children) == 1
    assert taken == 1
