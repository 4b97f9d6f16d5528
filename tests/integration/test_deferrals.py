"""A deferred step (model retry backoff, rate-limit wait) is not taken for
a lost one by the sweeper, however long its countdown."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import Client, Settings
from schemas import AgentSpec, EventName
from schemas.specs import RetryPolicy
from tests.integration.test_sweeper import sweeping
from tests.loopback_llm import LoopbackLLM

pytestmark = pytest.mark.integration

STALL = 2.0  # the sweeper's stall timeout here
EVERY = 0.3  # seconds between its sweeps
BACKOFF = 8.0  # well over the stall timeout plus a sweep interval


@pytest.mark.long
def test_retry_backoff_longer_than_the_stall_timeout_is_not_redispatched_early(
    client: Client, settings: Settings, workers: Any
) -> None:
    assert STALL + 2 * EVERY < BACKOFF / 2
    # (the sweep of ``chorus.sweep``, run here with a short stall timeout on
    # the session's fleet)
    sweeper_settings = settings.model_copy(update={"stall_timeout": STALL})
    sweeper_client = Client(sweeper_settings)
    try:
        with LoopbackLLM() as server, sweeping(sweeper_client, every=EVERY) as sweeper:
            # Given the sweeper, and a provider that fails once (retryable), then answers
            server.enqueue_error(503, message="overloaded")
            server.enqueue_text("Recovered.")
            agent = AgentSpec(
                name="deferred",
                model="openai/loopback-model",
                model_settings={"api_base": server.base_url},
                retry=RetryPolicy(initial_delay=BACKOFF, jitter=0.0, max_attempts=3),
            )

            # When the retry waits longer than the stall timeout
            job = client.submit(agent, "hi")
            answer = job.result(timeout=120)

            # Then the job completes with exactly one retry, sent when it was due
            assert answer == "Recovered."
            assert len(server.requests) == 2
    finally:
        sweeper_client.close()
    # and the sweeper sent nothing for it
    conversation_id = job.status().conversation_id
    assert not sweeper.sent_for(conversation_id)
    events = list(job.events(deltas=False, timeout=5))
    failed = [e for e in events if e.name is EventName.LLM_FAILED]
    requested = [e for e in events if e.name is EventName.LLM_REQUESTED]
    assert len(failed) == 1 and len(requested) == 2
    waited = (requested[1].time - failed[0].time).total_seconds()
    assert waited >= BACKOFF * 0.9, f"the retry ran after {waited:.1f}s, before it was due"
