"""What a follower sees while a model call streams (issue 21, item 16)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from orchestrator import Client, Job, Settings
from schemas import Event, EventName
from tests.agents import gate_path
from tests.integration.test_stops import _until

pytestmark = pytest.mark.integration


def _follow(job: Job, seen: list[Event], following: threading.Event) -> None:
    for event in job.events(timeout=60):
        seen.append(event)
        following.set()


def test_every_follower_sees_a_model_call_start_before_its_text(
    client: Client, workers: Any, settings: Settings
) -> None:
    # Given a job followed from its start
    gate = uuid.uuid4().hex
    job = client.submit("gated", f"{gate} streamed")
    early: list[Event] = []
    early_following = threading.Event()
    threads = [threading.Thread(target=_follow, args=(job, early, early_following))]
    threads[0].start()
    # ... whose model call is under way, and a follower joining while it runs
    _until(gate_path(settings.state_dir, f"{gate}-started").exists, "the call never started")
    late: list[Event] = []
    late_following = threading.Event()
    threads.append(threading.Thread(target=_follow, args=(job, late, late_following)))
    threads[1].start()
    assert early_following.wait(30) and late_following.wait(30)

    # When the model streams its answer
    gate_path(settings.state_dir, gate).touch()
    for thread in threads:
        thread.join(60)
    assert job.result(timeout=5) == "done streamed"

    # Then each follower saw the step's llm.requested before any of its text
    for seen in (early, late):
        names = [e.name for e in seen]
        assert EventName.ASSISTANT_DELTA in names, names
        assert names.index(EventName.LLM_REQUESTED) < names.index(EventName.ASSISTANT_DELTA)
        assert names[-1] is EventName.TURN_COMPLETED
        # ... and every stored event once, in order
        stored = [e.seq for e in seen if e.seq is not None]
        assert stored == sorted(set(stored))
