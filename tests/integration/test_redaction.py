"""Credentials never leave a worker: one redaction for logs, events, rows,
errors and prompts, by shape and by the value of the keys the workers hold."""

from __future__ import annotations

import json

import pytest

from orchestrator import Client, JobFailedError
from orchestrator.keys import events_stream
from schemas import AgentSpec, EventName
from tests.agents import LEAKED_PAIR_VALUE, LEAKED_TOKEN
from tests.conftest import PROVIDER_KEY, WorkerProcess, tool_calls
from tests.loopback_llm import LoopbackLLM

pytestmark = pytest.mark.integration

SECRETS = (PROVIDER_KEY, LEAKED_PAIR_VALUE, LEAKED_TOKEN)


def _leaks(where: str, text: str) -> list[str]:
    """Where each secret found in ``text`` was (a secret's first 6 characters)."""
    return [f"{secret[:6]}… in {where}" for secret in SECRETS if secret in text]


def test_credentials_reach_no_event_row_error_prompt_or_log(
    client: Client, workers: dict[str, WorkerProcess]
) -> None:
    with LoopbackLLM() as server:
        # Given a tool that fails with credentials in its message (a pair, a
        # GitHub token, the worker's Groq key) and one that returns the key,
        # then a provider that refuses the key and echoes it, as Groq does
        server.enqueue_tool_calls([("leaky", {"fail": True}), ("leaky", {"fail": False})])
        server.enqueue_error(401, message=f"Invalid API Key: {PROVIDER_KEY}")
        agent = AgentSpec(
            name="leaky-groq",
            model="groq/loopback-model",
            tools=("leaky",),
            model_settings={"api_base": server.base_url},
        )

        # When the fleet runs the turn
        job = client.submit(agent, "go")
        with pytest.raises(JobFailedError) as caught:
            job.result(timeout=60)
        events = list(job.events(deltas=False, timeout=10))
        first, second = server.received

    # Then the key was the one the provider got (the workers really hold it)
    assert first.headers["Authorization"] == f"Bearer {PROVIDER_KEY}"
    failed, returned = tool_calls(client, job.id)
    assert failed.is_error and not returned.is_error
    assert {EventName.TOOL_FAILED, EventName.LLM_FAILED, EventName.TURN_FAILED} <= {
        e.name for e in events
    }
    rt = client.runtime
    entries = rt.redis.xrange(events_stream(rt.settings.redis_prefix, job.root_id))
    assert entries
    status = job.status().error or ""
    # and no credential is in a row, an event, an error the caller sees,
    # the next prompt, the live stream or a worker's log
    places = {
        "tool call rows": json.dumps([failed.result, returned.result]),
        "events": json.dumps([e.model_dump(mode="json") for e in events]),
        "status().error": status,
        "JobFailedError": str(caught.value),
        "the next prompt": json.dumps(second.body),
        "the live stream": repr(entries),
        **{f"{w.name}'s log": w.log_path.read_text(errors="replace") for w in workers.values()},
    }
    leaks = [leak for where, text in places.items() for leak in _leaks(where, text)]
    assert not leaks, "\n".join(leaks)
    # each is masked where it was: the error result, the returned key, the
    # provider's echo
    assert "api_key=***" in failed.result and "ghp_***" in failed.result
    assert returned.result == "configured with ***"
    assert "api_key=***" in json.dumps(second.body)
    [refused] = [e for e in events if e.name is EventName.LLM_FAILED]
    assert refused.data["status"] == 401 and "Invalid API Key: ***" in refused.data["body"]
    assert "401" in status


def test_a_key_split_across_streamed_deltas_never_reaches_the_live_stream(
    client: Client, workers: dict[str, WorkerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a model that streams the workers' key in pieces of four
    # characters, each piece its own live event (each delta was redacted
    # alone, so none held the whole key and a follower joined them)
    import tests.loopback_llm as loopback

    monkeypatch.setattr(
        loopback, "_pieces", lambda text: [text[i : i + 4] for i in range(0, len(text), 4)]
    )
    with LoopbackLLM() as server:
        server.enqueue_text(f"the key is {PROVIDER_KEY} and that is all", chunk_delay=0.25)
        agent = AgentSpec(
            name="leaky-stream",
            model="groq/loopback-model",
            model_settings={"api_base": server.base_url},
        )
        job = client.submit(agent, "go")
        events = list(job.events(timeout=60))
    deltas = [e.data["text"] for e in events if e.name is EventName.ASSISTANT_DELTA]
    # Then followers saw the text in several deltas, the key masked
    assert len(deltas) > 3
    assert "".join(deltas) == "the key is *** and that is all"
    assert job.result(timeout=5) == "the key is *** and that is all"
