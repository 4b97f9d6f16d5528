"""The loop's decisions: a job's calls, rows, events and conversation (on the harness)."""

from __future__ import annotations

from typing import Any

from sqlmodel import col, select

from orchestrator import Client
from orchestrator.store.tables import EventRow, MessageRow, ToolCallRow, Turn
from schemas import TurnStatus
from tests.conftest import tool_calls


def rows(client: Client, model: Any, **where: Any) -> list[Any]:
    with client.runtime.session() as s:
        query = select(model)
        for key, value in where.items():
            query = query.where(getattr(model, key) == value)
        return list(s.exec(query.order_by(col(model.id))).all())


def test_example_job_completes_and_postgres_tells_the_story(client: Client) -> None:
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
    # each streamed call says when its first token came, within the call
    timed = [e.data for e in events if e.name == "llm.completed"]
    assert all(0 <= t["first_token_seconds"] <= t["seconds"] for t in timed), timed
    turn = rows(client, Turn, id=job.id)[0]
    assert turn.status == TurnStatus.COMPLETED and turn.output == answer and turn.steps == 2
    assert turn.input_tokens > 0 and turn.output_tokens > 0


def test_idempotency_key_returns_the_same_job(client: Client) -> None:
    first = client.submit("trip-planner", "Lisbon", idempotency_key="trip-42")
    second = client.submit("trip-planner", "Lisbon", idempotency_key="trip-42")
    assert second.id == first.id
    first.result(timeout=60)
    assert len(rows(client, Turn, idempotency_key="trip-42")) == 1


def test_second_submit_continues_the_conversation(client: Client) -> None:
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
