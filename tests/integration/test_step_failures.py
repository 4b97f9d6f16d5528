"""A step that fails the same way on every attempt fails its turn, once,
instead of being re-sent by the sweeper forever."""

from __future__ import annotations

import time
from typing import Any

import pytest

from orchestrator import ChorusError, Client, JobFailedError
from schemas import EventName
from tests.agents import CORE_BOOM

pytestmark = pytest.mark.integration


def test_a_step_that_always_raises_fails_the_turn(client: Client, workers: Any) -> None:
    # Given an agent whose context transformer raises on every call
    began = time.monotonic()
    job = client.submit("core-broken", "hi")

    # When the job runs, then it fails in bounded time with the error
    with pytest.raises(ChorusError) as caught:
        job.result(timeout=30)
    assert time.monotonic() - began < 30
    assert isinstance(caught.value, JobFailedError) and caught.value.status == "failed"
    assert CORE_BOOM in (caught.value.error or "")
    events = list(job.events(deltas=False, timeout=5))
    failed = [e for e in events if e.name is EventName.TURN_FAILED]
    assert len(failed) == 1
    assert "RuntimeError" in failed[0].data["error"] and CORE_BOOM in failed[0].data["error"]
    assert not [e for e in events if e.name is EventName.LLM_REQUESTED]  # it never got that far


def test_a_failing_subagent_answers_its_parent_with_the_error(client: Client, workers: Any) -> None:
    # Given a lead whose subagent's step raises every time
    job = client.submit("core-broken-lead", "go")

    # Then the child's turn fails and the lead gets its error as the tool result
    answer = job.result(timeout=30)
    assert "Error: subagent failed" in answer and CORE_BOOM in answer
    events = list(job.events(deltas=False, timeout=5))
    child_failed = [
        e
        for e in events
        if e.name is EventName.TURN_FAILED and e.conversation_id != job.conversation_id
    ]
    assert len(child_failed) == 1 and CORE_BOOM in child_failed[0].data["error"]
