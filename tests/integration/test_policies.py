"""Policies through the public interface, against worker processes and a
loopback OpenAI-compatible server (README "Your own policies")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Agent, Client, JobFailedError
from orchestrator.errors import UnknownPolicyError
from orchestrator.store.tables import Conversation
from schemas import AgentSpec, EventName, TextBlock
from schemas.specs import RetryPolicy
from tests.agents import LOOPBACK_FALLBACK, POLICY_BOOM
from tests.conftest import WorkerProcess, tool_calls
from tests.loopback_llm import LoopbackLLM

pytestmark = pytest.mark.integration

PRIMARY = "openai/loopback-primary"


def agent(server: LoopbackLLM, *policies: str) -> AgentSpec:
    return AgentSpec(
        name="policed",
        model=PRIMARY,
        system="You answer.",
        policies=policies,
        retry=RetryPolicy(initial_delay=0.2, factor=1.0, jitter=0.0),
        model_settings={"api_base": server.base_url},
    )


def sent_models(server: LoopbackLLM) -> list[str]:
    return [r["model"] for r in server.requests]


def events(job: Any, name: EventName) -> list[Any]:
    return [e for e in job.events(deltas=False, timeout=5) if e.name is name]


def test_the_fallback_model_is_called_after_exactly_two_5xx(client: Client, workers: Any) -> None:
    # Given a primary model that answers 503, 429, 503: two 5xx, one rate limit
    with LoopbackLLM() as server:
        server.enqueue_error(503, message="overloaded")
        server.enqueue_error(429, message="slow down")
        server.enqueue_error(503, message="overloaded")
        server.enqueue_text("Answered by the fallback.")

        # When an agent with the README's fallback policy runs a turn
        job = client.submit(agent(server, "fallback-loopback"), "hi")
        answer = job.result(timeout=60)

    # Then the primary was retried until its second 5xx, and only then the fallback called
    assert answer == "Answered by the fallback."
    model = PRIMARY.removeprefix("openai/")
    assert sent_models(server) == [model, model, model, LOOPBACK_FALLBACK.removeprefix("openai/")]
    failed = events(job, EventName.LLM_FAILED)
    assert [(e.data["status"], e.data["attempt"], e.data["model"]) for e in failed] == [
        (503, 1, PRIMARY),
        (429, 2, PRIMARY),
        (503, 3, PRIMARY),
    ]
    assert [e.data["policy"] for e in failed] == ["retry"] * 3
    requested = events(job, EventName.LLM_REQUESTED)
    assert [e.data["model"] for e in requested] == [PRIMARY] * 3 + [LOOPBACK_FALLBACK]


def test_one_5xx_retries_the_same_model(client: Client, workers: Any) -> None:
    with LoopbackLLM() as server:
        server.enqueue_error(502, message="bad gateway")
        server.enqueue_text("Primary again.")
        job = client.submit(agent(server, "fallback-loopback"), "hi")
        assert job.result(timeout=60) == "Primary again."
    model = PRIMARY.removeprefix("openai/")
    assert sent_models(server) == [model, model]


def test_the_model_gets_redacted_requests_and_the_conversation_keeps_the_original(
    client: Client, workers: Any
) -> None:
    # Given an agent with the README's redaction policy
    with LoopbackLLM() as server:
        server.enqueue_text("Noted.")
        text = "Write to ada@example.com or bob.smith+x@mail.example.org, please."

        # When a turn runs
        job = client.submit(agent(server, "redact-emails"), text)
        assert job.result(timeout=60) == "Noted."

    # Then the provider saw no address, only the placeholders
    (request,) = server.requests
    user = request["messages"][-1]["content"]
    assert user == "Write to [email] or [email], please."
    assert "@" not in str(request["messages"])
    # and the stored conversation holds what the user wrote
    stored = client.history(job.conversation_id)[0]
    assert stored.content == [TextBlock(text=text)]


def test_a_checkpoint_summarizer_gets_the_redacted_history(client: Client, workers: Any) -> None:
    # Given a conversation whose first message holds an address
    with LoopbackLLM() as server:
        server.enqueue_text("Noted.")
        job = client.submit(agent(server, "redact-emails"), "I am ada@example.com.")
        assert job.result(timeout=60) == "Noted."

        # When a checkpoint summarizes it
        server.enqueue_text("A customer introduced themselves.")
        client.checkpoint(job.conversation_id)
        deadline = time.monotonic() + 60
        while len(server.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)

    # Then the summarizer's request went through the agent's policies too
    assert len(server.requests) == 2
    summarizer = str(server.requests[1]["messages"])
    assert "[email]" in summarizer and "@" not in summarizer


def test_an_unknown_policy_is_refused_at_declaration_and_submit(client: Client) -> None:
    with pytest.raises(UnknownPolicyError, match="no-such-policy"):
        Agent("with-unknown-policy", model="scripted/x", policies=["no-such-policy"])
    spec = AgentSpec(name="inline-unknown", model="scripted/x", policies=("no-such-policy",))
    with pytest.raises(UnknownPolicyError, match="registered policies"):
        client.submit(spec, "hi")


def test_a_policy_that_raises_fails_the_turn_and_nothing_else(
    client: Client, workers: dict[str, WorkerProcess]
) -> None:
    with LoopbackLLM() as server:
        # Given an agent whose policy raises on every call
        job = client.submit(agent(server, "explode"), "hi")

        # Then its turn fails with a PolicyError naming the policy and the cause
        with pytest.raises(JobFailedError) as caught:
            job.result(timeout=60)
        error = caught.value.error or ""
        assert "PolicyError" in error and "'explode'" in error
        assert "RuntimeError" in error and POLICY_BOOM in error
        assert server.requests == []  # the model was never called

        # And the conversation takes its next turn, on the same worker
        server.enqueue_text("Back to normal.")
        again = client.submit(agent(server), "hi again", conversation_id=job.conversation_id)
        assert again.result(timeout=60) == "Back to normal."
    assert workers["llm"].proc.poll() is None


def test_a_deferring_policy_holds_the_call_without_a_worker_slot(
    client: Client, workers: Any, tmp_path: Path
) -> None:
    # Given a policy that defers while a file exists
    hold = tmp_path / "hold"
    hold.touch()
    with LoopbackLLM() as server:
        server.enqueue_text("Released.")
        job = client.submit(
            agent(server, "hold-while-file"), "hi", context_data={"hold": str(hold)}
        )
        # When the file goes, once the step was deferred (its due time recorded)
        while _due_at(client, job.conversation_id) is None:
            time.sleep(0.05)
        hold.unlink()

        # Then the call is made once, when the policy admits it
        assert job.result(timeout=60) == "Released."
    assert len(server.requests) == 1
    assert len(events(job, EventName.LLM_REQUESTED)) == 1


def _due_at(client: Client, conversation_id: str) -> Any:
    with client.runtime.session() as session:
        conv = session.get(Conversation, conversation_id)
        return None if conv is None else conv.due_at


def test_a_tool_policy_rewrites_arguments_or_refuses_the_call(client: Client, workers: Any) -> None:
    # Given an agent whose policy caps add's b at 10 and refuses a over 100
    with LoopbackLLM() as server:
        server.enqueue_tool_calls([("add", {"a": 2, "b": 40}), ("add", {"a": 200, "b": 1})])
        server.enqueue_text("Done.")
        spec = agent(server, "guard-add").model_copy(update={"tools": ("add",)})

        # When the model calls add twice
        job = client.submit(spec, "add things")
        assert job.result(timeout=60) == "Done."

    # Then the first ran with the rewritten arguments, the second did not run
    results = [m["content"] for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert results == [
        "12",
        "Error: tool call refused by policy 'guard-add': sums over 100 need a human",
    ]
    # and the stored calls keep what the model sent
    calls = tool_calls(client, job.id)
    assert [c.params for c in calls] == [{"a": 2, "b": 40}, {"a": 200, "b": 1}]
    assert [c.is_error for c in calls] == [False, True]


def test_a_tool_policy_defers_a_call_without_a_worker_slot(
    client: Client, workers: Any, tmp_path: Path
) -> None:
    # Given a policy that defers tool calls while a file exists
    hold = tmp_path / "hold"
    hold.touch()
    with LoopbackLLM() as server:
        server.enqueue_tool_calls([("add", {"a": 2, "b": 3})])
        server.enqueue_text("Done.")
        spec = agent(server, "hold-tools-while-file").model_copy(update={"tools": ("add",)})
        job = client.submit(spec, "add", context_data={"hold": str(hold)})

        # When the call was deferred (sent again with a countdown), then let go
        deferred = tmp_path / "hold.deferred"
        while not deferred.exists():
            time.sleep(0.05)
        deadline = time.monotonic() + 10
        while (call := tool_calls(client, job.id)[0]).status != "pending":  # given back
            assert time.monotonic() < deadline, call.status
            time.sleep(0.05)
        assert call.result is None
        assert _due_at(client, job.conversation_id) is not None  # the sweeper waits for it
        hold.unlink()

        # Then the tool runs once and the step goes on
        assert job.result(timeout=60) == "Done."
    results = [m["content"] for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert results == ["5"]
    [call] = tool_calls(client, job.id)
    assert call.attempts == 1  # deferrals are not runs
    assert len(events(job, EventName.TOOL_STARTED)) == 1


def test_an_observer_sees_each_reply_with_its_attempt(
    client: Client, workers: Any, tmp_path: Path
) -> None:
    log = tmp_path / "replies.log"
    with LoopbackLLM() as server:
        server.enqueue_error(500, message="oops")
        server.enqueue_text("Second time lucky.")
        job = client.submit(agent(server, "log-replies"), "hi", context_data={"log": str(log)})
        assert job.result(timeout=60) == "Second time lucky."
    assert log.read_text() == f"{PRIMARY} attempt 2: Second time lucky.\n"


def test_a_policy_decides_a_failure_before_the_built_in_retry(client: Client, workers: Any) -> None:
    with LoopbackLLM() as server:
        server.enqueue_error(503, message="overloaded")
        job = client.submit(agent(server, "no-retry-on-5xx"), "hi")
        with pytest.raises(JobFailedError) as caught:
            job.result(timeout=60)
    assert (
        caught.value.error == f"policy 'no-retry-on-5xx' stopped the model call: {PRIMARY} is down"
    )
    assert len(server.requests) == 1
    (failed,) = events(job, EventName.LLM_FAILED)
    assert failed.data["policy"] == "no-retry-on-5xx" and failed.data["retry_in"] is None
