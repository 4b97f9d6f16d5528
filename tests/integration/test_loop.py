"""The loop end to end through separate `chorus worker` processes."""

from __future__ import annotations

from typing import Any

import pytest
from sqlmodel import col, select

from orchestrator import Client
from orchestrator.store.tables import EventRow, MessageRow, ToolCallRow, Turn
from schemas import EventName, TurnStatus
from tests.conftest import tool_calls

pytestmark = pytest.mark.integration


def rows(client: Client, model: Any, **where: Any) -> list[Any]:
    with client.runtime.session() as s:
        query = select(model)
        for key, value in where.items():
            query = query.where(getattr(model, key) == value)
        return list(s.exec(query.order_by(col(model.id))).all())


def test_example_job_completes_and_postgres_tells_the_story(client: Client, workers: Any) -> None:
    # Given the example agent: three parallel lookups, one barrier booking
    job = client.submit("trip-planner", "Three nights in Lisbon, please book.")

    # When the fleet runs it
    answer = job.result(timeout=60)

    # Then the answer uses every tool result
    # the results' one copy is the step's tool-results message, not the call rows
    assert [c.result for c in rows(client, ToolCallRow, turn_id=job.id)] == [None] * 4
    calls = tool_calls(client, job.id)
    by_tool = {c.tool: c for c in calls}
    assert set(by_tool) == {"weather", "flights", "hotels", "book_trip"}
    assert "sunny" in answer and "24" in answer
    assert "TP" in answer and "189" in answer
    assert "Casa do Rio" in answer
    assert by_tool["book_trip"].result["booking_ref"] in answer

    # And the rows tell the whole story
    assert all(c.status == "completed" and not c.is_error for c in calls)
    assert [c.segment for c in sorted(calls, key=lambda c: c.position)] == [0, 0, 0, 1]
    messages = rows(client, MessageRow, conversation_id=job.conversation_id)
    assert [(m.kind, m.step) for m in messages] == [
        ("input", 0),
        ("assistant", 0),
        ("tool_results", 0),
        ("assistant", 1),
    ]
    assert messages[-1].content[0]["text"] == answer
    # numbered per root: increasing, unique, not contiguous (docs/architecture.md)
    events = sorted(rows(client, EventRow, root_id=job.root_id), key=lambda e: e.seq)
    assert len({e.seq for e in events}) == len(events)
    names = [e.name for e in events]
    assert names[0] == "turn.started" and names[-1] == "turn.completed"
    assert names.count("tool.requested") == 4
    assert names.count("tool.started") == 4
    assert names.count("tool.completed") == 4
    assert names.count("llm.completed") == 2
    turn = rows(client, Turn, id=job.id)[0]
    assert turn.status == TurnStatus.COMPLETED and turn.output == answer and turn.steps == 2
    assert turn.input_tokens > 0 and turn.output_tokens > 0


def test_live_events_stream_deltas_and_end_with_the_turn(client: Client, workers: Any) -> None:
    job = client.submit("trip-planner", "Lisbon again")
    seen = list(job.events(timeout=60))
    names = [e.name for e in seen]
    assert EventName.ASSISTANT_DELTA in names
    assert names[-1] is EventName.TURN_COMPLETED
    stored = [e.seq for e in seen if e.seq is not None]
    assert stored == sorted(stored) and len(stored) == len(set(stored))
    # resuming from a sequence number replays only what came after it
    resumed = list(job.events(since=stored[5], deltas=False, timeout=10))
    assert [e.seq for e in resumed] == stored[6:]


def test_parallel_calls_overlap_and_barrier_runs_alone(client: Client, workers: Any) -> None:
    job = client.submit("ordering", "go")
    job.result(timeout=60)
    calls = tool_calls(client, job.id)
    span = {c.result["label"]: (c.result["start"], c.result["end"]) for c in calls}
    first = [span[k] for k in ("p1", "p2", "p3")]
    after = [span[k] for k in ("q1", "q2")]
    barrier = span["b"]
    # parallel calls overlap in time
    assert max(s for s, _ in first) < min(e for _, e in first)
    assert max(s for s, _ in after) < min(e for _, e in after)
    # the barrier starts after every earlier call ended, later calls after it ended
    assert barrier[0] >= max(e for _, e in first)
    assert min(s for s, _ in after) >= barrier[1]
    assert [c.segment for c in calls] == [0, 0, 0, 1, 2, 2]


def test_idempotency_key_returns_the_same_job(client: Client, workers: Any) -> None:
    first = client.submit("trip-planner", "Lisbon", idempotency_key="trip-42")
    second = client.submit("trip-planner", "Lisbon", idempotency_key="trip-42")
    assert second.id == first.id
    first.result(timeout=60)
    assert len(rows(client, Turn, idempotency_key="trip-42")) == 1


def test_second_submit_continues_the_conversation(client: Client, workers: Any) -> None:
    first = client.submit("chatty", "hello", context_data={"tenant": "acme"})
    out = first.result(timeout=60)
    assert '"tenant": "acme"' in out and first.conversation_id in out
    second = client.submit("chatty", "again", conversation_id=first.conversation_id)
    assert second.conversation_id == first.conversation_id
    assert second.result(timeout=60) == "I have seen 2 user messages: hello | again"
    history = client.history(first.conversation_id)
    assert [m.role.value for m in history] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
