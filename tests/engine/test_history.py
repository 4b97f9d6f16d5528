"""The model request of a long conversation is its whole history, however it
was loaded: a worker reads only what is new since its last step, and a
checkpoint's summary stands in for what came before the boundary."""

from __future__ import annotations

import time
from typing import Any

from sqlmodel import col, select

from orchestrator import Client
from orchestrator.context import TransformContext, apply
from orchestrator.engine.history import model_prompt, row_to_message
from orchestrator.llm.call import to_openai_messages
from orchestrator.ratelimit import json_chars, request_tokens
from orchestrator.store.tables import CheckpointRow, MessageRow
from schemas import AgentSpec
from tests.loopback_llm import LoopbackLLM

SYSTEM = "You echo."


def _blob(turn: int, step: int) -> str:
    return f"turn {turn} step {step}: " + "payload " * 200


def _turn(server: LoopbackLLM, client: Client, agent: AgentSpec, n: int, **kw: Any) -> str:
    """A turn that calls echo_back ``n`` times, one step each, then answers."""
    turn = len(server.requests)
    for step in range(n):
        server.enqueue_tool_calls([("echo_back", {"value": _blob(turn, step)})])
    server.enqueue_text(f"done {turn}")
    job = client.submit(agent, f"turn {turn}", **kw)
    assert job.result(timeout=120) == f"done {turn}"
    return job.conversation_id


def _without_nones(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def _expected(
    client: Client, agent: AgentSpec, conversation_id: str, checkpoint: CheckpointRow | None
) -> list[list[dict[str, Any]]]:
    """Every request the conversation's model calls should have sent, rebuilt
    from all its stored messages the way a prompt is defined: the history
    before each assistant message, through the agent's context chain."""
    with client.runtime.session() as session:
        rows = session.exec(
            select(MessageRow)
            .where(MessageRow.conversation_id == conversation_id)
            .order_by(col(MessageRow.id))
        ).all()
    ids = [r.id for r in rows]
    requests = []
    for end, row in enumerate(rows):
        if row.kind != "assistant":
            continue
        cut = checkpoint is not None and (row.id or 0) > checkpoint.boundary_message_id
        ctx = TransformContext(
            agent=agent,
            boundary=ids.index(checkpoint.boundary_message_id) if checkpoint and cut else None,
            summary=checkpoint.summary if checkpoint and cut else None,
        )
        history = apply([row_to_message(r) for r in rows[:end]], ctx)
        requests.append(_without_nones(to_openai_messages(SYSTEM, history)))
    return requests


def _sent(server: LoopbackLLM, first: int = 0) -> list[list[dict[str, Any]]]:
    """The messages of the agent's requests (not the summarizer's) from ``first`` on."""
    return [
        _without_nones(r["messages"])
        for r in server.requests[first:]
        if r["messages"][0]["content"] == SYSTEM
    ]


def test_long_conversation_requests_hold_the_whole_history(client: Client) -> None:
    with LoopbackLLM() as server:
        agent = AgentSpec(
            name="history-echo",
            model="openai/loopback-model",
            system=SYSTEM,
            tools=("echo_back",),
            max_steps=50,
            model_settings={"api_base": server.base_url},
        )
        # Two turns of one conversation on the same worker: later steps
        # reuse what the worker loaded for earlier ones
        conversation = _turn(server, client, agent, 12)
        _turn(server, client, agent, 3, conversation_id=conversation)
        assert _sent(server) == _expected(client, agent, conversation, None)

        # After a checkpoint: the summary, then the messages after its boundary
        server.enqueue_text("SUMMARY: turns 0 and 13, all echoes")
        client.checkpoint(conversation)
        deadline = time.monotonic() + 30
        while (checkpoint := _checkpoint(client, conversation)) is None:
            assert time.monotonic() < deadline, "the checkpoint never completed"
            time.sleep(0.2)
        after = len(server.requests)
        _turn(server, client, agent, 6, conversation_id=conversation)
        sent = _sent(server, after)
        assert sent[0][1]["content"].endswith("SUMMARY: turns 0 and 13, all echoes")
        assert sent == _expected(client, agent, conversation, checkpoint)[-len(sent) :]

        # A fork copies the messages (new rows) but not the checkpoint: its
        # model sees every message again
        fork = client.fork(conversation)
        after = len(server.requests)
        _turn(server, client, agent, 2, conversation_id=fork)
        sent = _sent(server, after)
        assert sent == _expected(client, agent, fork, None)[-len(sent) :]
        assert len(sent[0]) == 1 + 2 * (13 + 4 + 7) + 1  # system, 3 turns, the new input

    # The size a step counts from its cached sizes is that of the request's JSON
    with client.runtime.session() as session:
        for _ in range(2):  # read from Postgres, then from this process's cache
            prompt = model_prompt(session, conversation, agent, SYSTEM)
            assert prompt.chars == json_chars(prompt.messages)
            assert request_tokens(prompt.messages, (), prompt.chars) == request_tokens(
                prompt.messages
            )


def _checkpoint(client: Client, conversation_id: str) -> CheckpointRow | None:
    with client.runtime.session() as session:
        return session.exec(
            select(CheckpointRow).where(CheckpointRow.conversation_id == conversation_id)
        ).first()
