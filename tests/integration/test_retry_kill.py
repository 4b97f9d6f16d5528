"""The retry count across a killed LLM worker (issue 22: retry counts in a
column): a SIGKILL between two failed calls neither loses nor doubles the
count, and the step's success leaves it at zero."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from orchestrator import Client
from orchestrator.store.tables import Conversation
from schemas import AgentSpec, EventName
from schemas.specs import RetryPolicy
from tests.conftest import WorkerProcess
from tests.fleet import running_beat
from tests.loopback_llm import LoopbackLLM

pytestmark = pytest.mark.integration


def test_a_killed_llm_worker_between_failures_keeps_the_retry_count(
    settings: Any, client: Client, workers: dict[str, WorkerProcess]
) -> None:
    with running_beat(settings), LoopbackLLM() as server:
        # Given a model that fails twice with a 503, then answers
        server.enqueue_error(503, message="overloaded")
        server.enqueue_error(503, message="overloaded")
        server.enqueue_text("Third time lucky.")
        spec = AgentSpec(
            name="retried-across-a-kill",
            model="openai/loopback-primary",
            retry=RetryPolicy(max_attempts=3, initial_delay=3.0, factor=1.0, jitter=0.0),
            model_settings={"api_base": server.base_url},
        )
        job = client.submit(spec, "hi")

        # When the LLM worker is SIGKILLed during the first retry's backoff
        deadline = time.monotonic() + 30
        while not server.requests:
            assert time.monotonic() < deadline, "the model was never called"
            time.sleep(0.05)
        time.sleep(0.5)  # the failure is stored and the retry sent
        os.killpg(workers["llm"].proc.pid, signal.SIGKILL)
        workers["llm"].proc.wait(10)
        workers["llm"] = WorkerProcess(
            settings, "llm2", "-Q", "llm,control", "-P", "threads", "-c", "16"
        )
        workers["llm"].wait_ready(client)

        # Then the turn ends on the third call: the count went 1, 2, not
        # restarted (a fourth call) nor doubled (a failure at 2 attempts)
        assert job.result(timeout=90) == "Third time lucky."
        assert len(server.requests) == 3
    failed = [e for e in job.events(deltas=False, timeout=5) if e.name is EventName.LLM_FAILED]
    assert [e.data["attempt"] for e in failed] == [1, 2]
    with client.runtime.session() as s:
        conv = s.get(Conversation, job.conversation_id)
        assert conv is not None and conv.step_failures == 0  # reset by the step's success
