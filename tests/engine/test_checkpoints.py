"""Checkpoints: the model sees a summary, Postgres keeps every message."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlmodel import select

from orchestrator import Client
from orchestrator.store.tables import CheckpointRow, Conversation
from schemas import AgentSpec, EventName
from tests.loopback_llm import LoopbackLLM

ALPHA, BRAVO, CHARLIE = ("alpha " * 20).strip(), ("bravo " * 20).strip(), ("charlie " * 15).strip()


def _sent(request: dict[str, Any]) -> str:
    return json.dumps(request["messages"])


def test_context_limit_checkpoints_on_its_own_and_on_request(client: Client) -> None:
    with LoopbackLLM() as server:
        agent = AgentSpec(
            name="forgetful",
            model="openai/loopback-model",
            system="You chat.",
            context_tokens=60,
            model_settings={"api_base": server.base_url},
        )
        # Turn 1 fits the limit
        server.enqueue_text("reply one")
        first = client.submit(agent, ALPHA)
        assert first.result(timeout=60) == "reply one"

        # Turn 2 would pass it: a checkpoint summarizes turn 1 first
        server.enqueue_text("SUMMARY-ONE: the user said alpha")
        server.enqueue_text("reply two")
        second = client.submit(agent, BRAVO, conversation_id=first.conversation_id)
        assert second.result(timeout=60) == "reply two"

        # A checkpoint asked for by the client, in the background
        server.enqueue_text("SUMMARY-TWO: alpha, then bravo")
        client.checkpoint(first.conversation_id)
        deadline = time.monotonic() + 30
        while True:
            with client.runtime.session() as s:
                checkpoints = s.exec(
                    select(CheckpointRow).where(
                        CheckpointRow.conversation_id == first.conversation_id
                    )
                ).all()
            if len(checkpoints) == 2:
                break
            assert time.monotonic() < deadline, "the requested checkpoint never completed"
            time.sleep(0.2)
        server.enqueue_text("reply three")
        third = client.submit(agent, CHARLIE, conversation_id=first.conversation_id)
        assert third.result(timeout=60) == "reply three"

    turn1, summary1, turn2, summary2, turn3 = server.requests
    assert ALPHA in _sent(turn1)
    # the summarizer saw turn 1 and the agent's system prompt
    assert ALPHA in _sent(summary1) and "You chat." in _sent(summary1)
    assert "briefing" in summary1["messages"][0]["content"]
    # later prompts hold the summary and only what came after the checkpoint
    assert "SUMMARY-ONE" in _sent(turn2) and BRAVO in _sent(turn2)
    assert ALPHA not in _sent(turn2)
    assert "SUMMARY-ONE" in _sent(summary2) and BRAVO in _sent(summary2)
    assert "SUMMARY-TWO" in _sent(turn3) and CHARLIE in _sent(turn3)
    assert ALPHA not in _sent(turn3) and BRAVO not in _sent(turn3)
    # while Postgres keeps every original message
    texts = [m.text for m in client.history(first.conversation_id)]
    assert texts == [ALPHA, "reply one", BRAVO, "reply two", CHARLIE, "reply three"]
    names = [e.name for e in second.events(deltas=False, timeout=5)]
    assert EventName.CHECKPOINT_STARTED in names and EventName.CHECKPOINT_COMPLETED in names
    with client.runtime.session() as s:
        kinds = s.exec(
            select(Conversation.kind).where(Conversation.parent_id == first.conversation_id)
        ).all()
    assert kinds == ["checkpoint", "checkpoint"]
