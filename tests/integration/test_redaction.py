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


def _clean(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret[:6]}… in {where}: {text[:2000]}"


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
    # and it is in no row: the error result masks each credential, the
    # returned value masks the key
    failed, returned = tool_calls(client, job.id)
    assert failed.is_error and not returned.is_error
    assert "api_key=***" in failed.result and "ghp_***" in failed.result
    assert returned.result == "configured with ***"
    _clean("tool call rows", json.dumps([failed.result, returned.result]))
    # in no event (tool.failed, llm.failed, turn.failed)
    assert {EventName.TOOL_FAILED, EventName.LLM_FAILED, EventName.TURN_FAILED} <= {
        e.name for e in events
    }
    _clean("events", json.dumps([e.model_dump(mode="json") for e in events]))
    [refused] = [e for e in events if e.name is EventName.LLM_FAILED]
    assert refused.data["status"] == 401 and "Invalid API Key: ***" in refused.data["body"]
    # in no error the caller sees
    status = job.status().error or ""
    assert "401" in status
    _clean("status().error", status)
    _clean("JobFailedError", str(caught.value))
    # in no prompt: the model saw the redacted results
    _clean("the next prompt", json.dumps(second.body))
    assert "api_key=***" in json.dumps(second.body)
    # on the live stream
    rt = client.runtime
    entries = rt.redis.xrange(events_stream(rt.settings.redis_prefix, job.root_id))
    assert entries
    _clean("the live stream", repr(entries))
    # and in no worker's log
    for worker in workers.values():
        _clean(f"{worker.name}'s log", worker.log_path.read_text(errors="replace"))
