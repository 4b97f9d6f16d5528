"""Handoffs: an agent hands the conversation to another, which answers the turn."""

from __future__ import annotations

import time

from sqlmodel import select

from orchestrator import Client, Job
from orchestrator.store.tables import Conversation
from schemas import EventName, Role, ToolCallBlock


def _job_for(client: Client, conversation_id: str, entry: str) -> Job:
    deadline = time.monotonic() + 60
    while (job := client.job_for_message(conversation_id, entry)) is None:
        assert time.monotonic() < deadline, f"message {entry} never started a turn"
        time.sleep(0.1)
    return job


def test_triage_hands_off_to_billing_which_answers(client: Client) -> None:
    # Given a triage agent whose model looks the order up and hands off to billing
    job = client.submit("ho-triage", "Refund my order 42")

    # When the fleet runs the turn
    answer = job.result(timeout=60)
    events = list(job.events(deltas=False, timeout=10))

    # Then billing answered, with its own tool (offered to it after the switch)
    assert answer == (
        "billing: order 42 refunded; tools ['ho_lookup', 'handoff__ho-billing', 'ho_refund']"
    )
    assert job.status().agent == "ho-billing"
    # the events record the switch, after the step's calls ran under triage
    (switch,) = [e for e in events if e.name is EventName.AGENT_HANDOFF]
    assert switch.data["from_agent"] == "ho-triage" and switch.data["to_agent"] == "ho-billing"
    assert switch.data["message"] == "wants a refund of order 42"
    names = [e.name for e in events]
    lookup_done = next(
        i
        for i, e in enumerate(events)
        if e.name is EventName.TOOL_COMPLETED and e.data["tool"] == "ho_lookup"
    )
    assert lookup_done < names.index(EventName.AGENT_HANDOFF)
    assert not any(e.name is EventName.TOOL_FAILED for e in events)
    # the history is one conversation holding both agents' messages
    with client.runtime.session() as session:
        tree = session.exec(select(Conversation).where(Conversation.root_id == job.root_id)).all()
    assert [c.id for c in tree] == [job.conversation_id]
    history = client.history(job.conversation_id)
    calls = [
        b.tool
        for m in history
        if m.role is Role.ASSISTANT
        for b in m.content
        if isinstance(b, ToolCallBlock)
    ]
    assert calls == ["ho_lookup", "handoff__ho-billing", "ho_refund"]

    # When the user writes again on the conversation
    entry = client.send(job.conversation_id, "Thanks!")

    # Then billing, the conversation's agent now, answers
    later = _job_for(client, job.conversation_id, entry)
    assert later.result(timeout=60) == "billing again: you are welcome"
    assert later.status().agent == "ho-billing"


def test_a_handoff_to_an_agent_not_listed_is_refused(client: Client) -> None:
    # Given an agent whose model hands off to a registered agent it does not list
    job = client.submit("ho-rogue", "Sell me something")
    answer = job.result(timeout=60)

    # Then the call is an error result, nothing switches and the agent answers itself
    assert "tool 'handoff__ho-sales' is not available to agent 'ho-rogue'" in answer
    events = list(job.events(deltas=False, timeout=10))
    assert not any(e.name is EventName.AGENT_HANDOFF for e in events)
    assert job.status().agent == "ho-rogue"
    with client.runtime.session() as session:
        conv = session.get(Conversation, job.conversation_id)
        assert conv is not None and conv.agent == "ho-rogue"
