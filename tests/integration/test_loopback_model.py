"""A real OpenAI-compatible HTTP server behind litellm, driven by the fleet."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import Client, JobFailedError
from schemas import AgentSpec, EventName
from schemas.specs import RetryPolicy
from tests.loopback_llm import LoopbackLLM

pytestmark = pytest.mark.integration


def loopback_agent(server: LoopbackLLM) -> AgentSpec:
    return AgentSpec(
        name="loopback",
        model="openai/loopback-model",
        system="You add numbers with the add tool.",
        tools=("add",),
        model_settings={"api_base": server.base_url},
    )


def test_tool_calls_and_streaming_through_litellm(client: Client, workers: Any) -> None:
    with LoopbackLLM() as server:
        # Given a model server that asks for a tool, then answers in a stream
        server.enqueue_tool_calls([("add", {"a": 2, "b": 40})], text="Adding.")
        server.enqueue_text("The sum is 42, as the tool said.", chunk_delay=0.01)

        # When the fleet runs the turn
        job = client.submit(loopback_agent(server), "What is 2 + 40?")
        events = list(job.events(timeout=60))
        answer = job.result(timeout=5)

    # Then the answer is the streamed text, built from deltas seen live
    assert answer == "The sum is 42, as the tool said."
    deltas = "".join(e.data["text"] for e in events if e.name is EventName.ASSISTANT_DELTA)
    assert "The sum is 42" in deltas
    # and the server saw: streaming requests, the tool schema, then the tool result
    first, second = server.requests
    assert first["stream"] is True and second["stream"] is True
    assert first["tools"][0]["function"]["name"] == "add"
    assert first["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
    assert first["messages"][0] == {
        "role": "system",
        "content": "You add numbers with the add tool.",
    }
    tool_message = next(m for m in second["messages"] if m["role"] == "tool")
    assert tool_message["content"] == "42"
    call_id = second["messages"][-2]["tool_calls"][0]["id"]
    assert tool_message["tool_call_id"] == call_id
    assert job.status().usage.input_tokens > 0


def test_streamed_calls_reuse_their_connection(client: Client, workers: Any) -> None:
    # Given a provider that keeps connections alive and streams chunked, as real ones do
    with LoopbackLLM(keep_alive=True) as server:
        server.enqueue_tool_calls([("add", {"a": 2, "b": 40})])
        server.enqueue_text("42.")

        # When the fleet runs a turn of two streamed model calls
        answer = client.submit(loopback_agent(server), "What is 2 + 40?").result(timeout=60)

        # Then both went over one connection: each stream was read to its end
        # (past "data: [DONE]"), so it went back to the client's pool
        assert answer == "42."
        assert len(server.requests) == 2
        assert server.connections == 1


def test_a_connection_lost_after_done_keeps_the_reply(client: Client, workers: Any) -> None:
    # Given a provider that drops the connection after "data: [DONE]", before the body's end
    with LoopbackLLM(keep_alive=True) as server:
        server.enqueue_text("Complete anyway.", drop_after_done=True)

        # Then the reply, whole at [DONE], is the answer: no failed call, no second call
        job = client.submit(loopback_agent(server), "hi")
        assert job.result(timeout=60) == "Complete anyway."
        assert len(server.requests) == 1
        assert not [e for e in job.events(timeout=5) if e.name is EventName.LLM_FAILED]


def test_provider_error_fails_the_turn_with_status(client: Client, workers: Any) -> None:
    with LoopbackLLM() as server:
        server.enqueue_error(401, message="bad key")
        job = client.submit(loopback_agent(server), "hi")
        with pytest.raises(JobFailedError, match="401") as caught:
            job.result(timeout=60)
    assert caught.value.status == "failed"
    failed = [e for e in job.events(timeout=5) if e.name is EventName.LLM_FAILED]
    assert failed and failed[0].data["status"] == 401 and "bad key" in failed[0].data["body"]


def test_rate_limited_calls_are_retried_with_growing_backoff(client: Client, workers: Any) -> None:
    # Given a model server that answers 429 twice, then succeeds
    with LoopbackLLM() as server:
        server.enqueue_error(429, n=2, message="slow down")
        server.enqueue_text("Fine now.")
        agent = AgentSpec(
            **{
                **loopback_agent(server).model_dump(),
                "retry": RetryPolicy(initial_delay=0.5, factor=2.0, jitter=0.0),
            }
        )
        job = client.submit(agent, "hi")
        answer = job.result(timeout=60)
    assert answer == "Fine now."
    events = list(job.events(deltas=False, timeout=5))
    failed = [e for e in events if e.name is EventName.LLM_FAILED]
    requested = [e for e in events if e.name is EventName.LLM_REQUESTED]
    assert [e.data["status"] for e in failed] == [429, 429]
    assert [e.data["attempt"] for e in failed] == [1, 2]
    assert [e.data["retry_in"] for e in failed] == [0.5, 1.0]  # the delay grew
    assert len(requested) == 3 and len(server.requests) == 3
    for fail, retry in zip(failed, requested[1:], strict=True):
        waited = (retry.time - fail.time).total_seconds()
        assert waited >= fail.data["retry_in"] * 0.9  # waited in the broker, not in a sleep
