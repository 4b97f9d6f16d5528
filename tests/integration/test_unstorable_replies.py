"""Replies that are hard to store: every call the provider answered is paid
for once and counted, and the turn goes on (issue 21, item 7)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from orchestrator import Client, Settings
from schemas import EventName
from tests.agents import SPRAWL, gate_path
from tests.conftest import tool_calls
from tests.integration.test_stops import _until

pytestmark = pytest.mark.integration


def test_a_reply_with_thousands_of_calls_is_stored_once_and_the_turn_goes_on(
    client: Client, workers: Any
) -> None:
    # Given a model whose reply makes 3,700 tool calls (two events each: more
    # parameters than one statement may carry)
    job = client.submit("sprawling", "call everything")

    # Then the reply is stored at its first call, and the turn goes on to its answer
    assert job.result(timeout=60) == f"results: {SPRAWL}"
    events = list(job.events(deltas=False, timeout=30))
    assert [e.step for e in events if e.name is EventName.LLM_REQUESTED] == [0, 1]
    assert [e.step for e in events if e.name is EventName.USAGE] == [0, 1]
    # ... the calls past the cap of one reply are error results saying so
    calls = tool_calls(client, job.id)
    assert len(calls) == SPRAWL and all(c.is_error for c in calls)
    assert "not available to agent" in calls[999].result
    assert all("one reply may make at most 1000 tool calls" in c.result for c in calls[1000:])


def _blocked_step(client: Client) -> int | None:
    """The server process of a step waiting for the conversation's row to
    store its reply: a SELECT … FOR UPDATE (not the lease's heartbeat, an
    UPDATE; the rest of its long text is cut off there)."""
    with client.runtime.session() as s:
        return s.execute(
            text(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND query LIKE 'SELECT%'"
            )
        ).scalar()


def test_a_reply_whose_storing_fails_is_still_counted(
    client: Client, workers: Any, settings: Settings
) -> None:
    # Given a model call under way, and its conversation's row held
    gate = uuid.uuid4().hex
    job = client.submit("gated", f"{gate} once")
    _until(gate_path(settings.state_dir, f"{gate}-started").exists, "the call never started")
    with client.runtime.session() as holder:
        holder.execute(
            text("SELECT id FROM chorus_conversation WHERE id = :id FOR UPDATE"),
            {"id": job.root_id},
        )
        gate_path(settings.state_dir, gate).touch()
        # When the step storing the provider's answer loses its connection
        _until(lambda: _blocked_step(client) is not None, "the step never waited")
        pid = _blocked_step(client)
        holder.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    # (the task is retried: the model is called again, and that reply stored)
    assert job.result(timeout=60) == "done once"

    # Then both calls count: the unstored one too
    events = list(job.events(deltas=False, timeout=30))
    usage = [e.data for e in events if e.name is EventName.USAGE]
    assert [u.get("unstored", False) for u in usage] == [True, False]
    tree = job.status().tree_usage
    assert tree.input_tokens == sum(u["input_tokens"] for u in usage) > 0
    assert tree.output_tokens == sum(u["output_tokens"] for u in usage) > 0
