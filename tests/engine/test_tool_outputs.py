"""Large tool outputs: kept whole in Postgres, shown to the model as a view
with a handle, read back in slices with ``read_tool_output``.

The agent ``big-reader`` (tests/agents.py) has ``tool_output_limit=10_000``;
its scripted model makes the calls its input lists and answers with the
tool messages it was shown for them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest
from sqlmodel import select

from orchestrator import Client, ToolOutputNotFound
from orchestrator.store.tables import ToolCallRow
from schemas import AgentSpec, EventName, ToolResultBlock
from tests.agents import big_text
from tests.conftest import tool_calls
from tests.loopback_llm import LoopbackLLM

LIMIT = 10_000
SIZE = 200_000
ROWS = [{"row": i, "name": f"item-{i}", "note": "déjà vu"} for i in range(SIZE // 40)]


def _run(client: Client, calls: list[tuple[str, dict[str, Any]]], **submit: Any) -> Any:
    """Submit a big-reader job making ``calls``; (the job, what the model was shown)."""
    wire = json.dumps([{"tool": tool, "params": params} for tool, params in calls])
    job = client.submit("big-reader", wire, **submit)
    return job, json.loads(job.result(timeout=60))


def _handle(view: str) -> str:
    found = re.search(r'read_tool_output\(handle="([0-9a-f]+)"', view)
    assert found is not None, view[:300]
    return found.group(1)


@dataclass
class Archived:
    conversation_id: str
    views: list[str]
    handles: list[str]


@pytest.fixture(scope="module")
def archived(client: Client) -> Archived:
    # Given a turn whose tool returns 200,000 characters of text and ~200 KB of JSON
    job, shown = _run(
        client,
        [("big_output", {"size": SIZE}), ("big_output", {"size": SIZE, "as_json": True})],
    )
    handles = [_handle(view) for view in shown]
    events = [e for e in job.events(deltas=False, timeout=10) if e.name == EventName.TOOL_COMPLETED]
    assert sorted(e.data["handle"] for e in events) == sorted(handles)
    assert all(e.data["truncated"] for e in events)
    return Archived(job.conversation_id, shown, handles)


def test_the_model_sees_a_view_with_a_handle_not_the_whole_output(archived: Archived) -> None:
    text_view, json_view = archived.views
    full = big_text(SIZE)
    # The model saw the head and tail of the text, with the size and the handle
    assert text_view.startswith(
        f"[The output of big_output is {SIZE} characters: showing the first 7500 and the last 2500."
    )
    head, _, tail = text_view.partition("\n")[2].partition(
        f"\n[… {SIZE - LIMIT} characters left out …]\n"
    )
    assert (head, tail) == (full[:7500], full[-2500:])
    assert len(text_view) < LIMIT + 300
    # and of the JSON rows, their JSON text's head
    json_text = json.dumps(ROWS, ensure_ascii=False)
    assert json_view.partition("\n")[2].startswith(json_text[:7500])
    assert len(json_view) < LIMIT + 300


def test_postgres_keeps_the_whole_output_once(client: Client, archived: Archived) -> None:
    # The client reads each whole output back by its handle
    text_handle, json_handle = archived.handles
    assert client.tool_output(archived.conversation_id, text_handle) == big_text(SIZE)
    assert client.tool_output(archived.conversation_id, json_handle) == ROWS
    # and the conversation's history holds only the views the model saw
    blocks = [
        b
        for m in client.history(archived.conversation_id)
        for b in m.content
        if isinstance(b, ToolResultBlock)
    ]
    assert [b.result for b in blocks] == archived.views


def test_the_model_reads_slices_of_an_archived_output(client: Client, archived: Archived) -> None:
    text_handle, json_handle = archived.handles
    full, json_text = big_text(SIZE), json.dumps(ROWS, ensure_ascii=False)
    # When the model asks for parts of both outputs, in the same conversation
    _, shown = _run(
        client,
        [
            ("read_tool_output", {"handle": text_handle, "offset": 100_000, "length": 45}),
            ("read_tool_output", {"handle": text_handle, "offset": SIZE - 10}),
            ("read_tool_output", {"handle": text_handle, "length": 50_000}),
            ("read_tool_output", {"handle": json_handle, "offset": 7_000, "length": 120}),
            ("read_tool_output", {"handle": text_handle, "offset": SIZE + 5}),
        ],
        conversation_id=archived.conversation_id,
    )
    # Then each is the slice asked for (a length is capped at the limit)
    assert shown == [
        f"[characters 100000 to 100045 of {SIZE}]\n{full[100_000:100_045]}",
        f"[characters {SIZE - 10} to {SIZE} of {SIZE}]\n{full[-10:]}",
        f"[characters 0 to {LIMIT} of {SIZE}]\n{full[:LIMIT]}",
        f"[characters 7000 to 7120 of {len(json_text)}]\n{json_text[7000:7120]}",
        f"[offset {SIZE + 5} is past the end: the output has {SIZE} characters]",
    ]


def test_a_handle_from_another_conversation_is_refused(client: Client, archived: Archived) -> None:
    handle = archived.handles[0]
    # When another conversation's model passes that handle, or a made-up one
    job, shown = _run(
        client,
        [
            ("read_tool_output", {"handle": handle}),
            ("read_tool_output", {"handle": "0" * 32, "offset": -1}),
            ("read_tool_output", {"handle": "0" * 32}),
        ],
    )
    # Then it gets error results and no byte of the output
    assert shown == [
        f"Error: no archived tool output {handle!r} in this conversation",
        "Error: offset must be an integer of at least 0, not -1",
        f"Error: no archived tool output {'0' * 32!r} in this conversation",
    ]
    # And the client refuses it for that conversation too
    with pytest.raises(ToolOutputNotFound):
        client.tool_output(job.conversation_id, handle)


def test_a_small_output_is_unchanged(client: Client) -> None:
    # When a tool's output is under the limit
    job, shown = _run(client, [("big_output", {"size": 500})])
    # Then the model sees it whole, and its message is its one copy
    assert shown == [big_text(500)]
    with client.runtime.session() as s:
        row = s.exec(select(ToolCallRow).where(ToolCallRow.turn_id == job.id)).one()
        assert (row.result, row.view_chars) == (None, None)
    with pytest.raises(ToolOutputNotFound):
        client.tool_output(job.conversation_id, row.id)


def _offered(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools", [])]


def test_read_tool_output_is_offered_only_where_an_output_was_cut(client: Client) -> None:
    with LoopbackLLM() as model:
        # Given an agent with one tool, whose model first calls it with a
        # small output and read_tool_output (not offered yet), then makes the
        # tool cut its output, then reads it
        agent = AgentSpec(
            name="cut-reader",
            model="openai/loopback-model",
            tools=("big_output",),
            tool_output_limit=1000,
            model_settings={"api_base": model.base_url},
        )
        model.enqueue_tool_calls(
            [("big_output", {"size": 10}), ("read_tool_output", {"handle": "0" * 32})]
        )
        model.enqueue_tool_calls([("big_output", {"size": 5000})])
        model.enqueue_text("Read enough.")
        job = client.submit(agent, "go")
        assert job.result(timeout=60) == "Read enough."
        first, second, third = model.requests

    # Then read_tool_output was offered only once a prompt held a cut output
    assert _offered(first) == _offered(second) == ["big_output"]
    assert _offered(third) == ["big_output", "read_tool_output"]
    # and its call, where it was not offered, was refused and never ran
    calls = {c.tool: c for c in tool_calls(client, job.id) if c.step == 0}
    refused = calls["read_tool_output"]
    assert refused.is_error
    assert "'read_tool_output' is not available to agent 'cut-reader'" in str(refused.result)
    started = [e.data["tool"] for e in job.events(deltas=False) if e.name is EventName.TOOL_STARTED]
    assert started == ["big_output", "big_output"]


def test_an_agent_listing_read_tool_output_is_offered_it_on_every_step(client: Client) -> None:
    with LoopbackLLM() as model:
        agent = AgentSpec(
            name="always-reader",
            model="openai/loopback-model",
            tools=("big_output", "read_tool_output"),
            model_settings={"api_base": model.base_url},
        )
        model.enqueue_text("Nothing to read.")
        assert client.submit(agent, "go").result(timeout=60) == "Nothing to read."
        (first,) = model.requests
    assert _offered(first) == ["big_output", "read_tool_output"]
