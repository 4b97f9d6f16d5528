"""A model can run only the tools its own agent was given."""

from __future__ import annotations

from pathlib import Path

from sqlmodel import select

from orchestrator import Client
from orchestrator.store.tables import Conversation
from schemas import EventName
from tests.conftest import tool_calls


def test_a_tool_the_agent_was_not_given_never_runs(client: Client, tmp_path: Path) -> None:
    # Given an agent with only `add`, whose model calls `weather`, a tool
    # that leaves a mark, a subagent and final_answer it was never given
    mark = tmp_path / "mark"
    job = client.submit("sec-intruder", "try everything", context_data={"mark": str(mark)})

    # Then the turn ends, and the model was shown one error per refused call
    answer = job.result(timeout=60)
    results = {c.tool: (c.is_error, str(c.result)) for c in tool_calls(client, job.id)}
    for name in ("weather", "leave_mark", "subagent__echo-child", "final_answer"):
        expected = f"Error: tool '{name}' is not available to agent 'sec-intruder'"
        assert results[name] == (True, expected)
        assert expected in answer
    assert results["add"] == (False, "3")

    # And none of them ran: no mark, no child conversation, no tool.started
    assert not mark.exists()
    with client.runtime.session() as s:
        children = s.exec(select(Conversation).where(Conversation.parent_id == job.conversation_id))
        assert children.all() == []
    started = [e.data["tool"] for e in job.events(deltas=False) if e.name is EventName.TOOL_STARTED]
    assert started == ["add"]


def test_the_same_tool_runs_for_an_agent_that_has_it(client: Client, tmp_path: Path) -> None:
    # The control: the mark is what a run of leave_mark leaves
    mark = tmp_path / "mark"
    job = client.submit("sec-marker", "mark it", context_data={"mark": str(mark)})
    assert "marked" in job.result(timeout=60)
    assert mark.read_text() == "ran\n"
