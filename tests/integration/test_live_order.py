"""What a follower sees while a model call streams (issue 21, item 16)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from orchestrator import Client, Job, Settings
from schemas import Event, EventName
from tests.agents import gate_path
from tests.integration.test_stops import _until

pytestmark = pytest.mark.integration


def _follow(job: Job, seen: list[Event], following: threading.Event) -> None:
    for event in job.events(timeout=60):
        seen.append(event)
        following.set()


def _follower(job: Job, seen: list[Event]) -> threading.Thread:
    """A thread following ``job`` into ``seen``, once it has seen its first event."""
    following = threading.Event()
    thread = threading.Thread(target=_follow, args=(job, seen, following))
    thread.start()
    assert following.wait(30), "the follower saw nothing"
    return thread


def test_every_follower_sees_a_model_call_start_before_its_text(
    client: Client, workers: Any, settings: Settings
) -> None:
    # Given a job followed from its start, its model call not sent yet
    llm = [workers["llm"].name]
    assert client.celery.control.cancel_consumer("llm", destination=llm, reply=True)
    gate = uuid.uuid4().hex
    early: list[Event] = []
    late: list[Event] = []
    try:
        job = client.submit("gated", f"{gate} streamed")
        threads = [_follower(job, early)]
        with client.runtime.session() as older:
            # ... and an older transaction open (anywhere in the cluster): what
            # commits meanwhile is announced live but not readable until it ends
            older.execute(text("SELECT pg_current_xact_id()"))
            assert client.celery.control.add_consumer("llm", destination=llm, reply=True)
            started = gate_path(settings.state_dir, f"{gate}-started")
            _until(started.exists, "the model call never started")
            # ... and a follower joining while the call runs
            threads.append(_follower(job, late))

            # When the model streams its answer, and the turn ends
            gate_path(settings.state_dir, gate).touch()
            assert job.result(timeout=60) == "done streamed"
    finally:
        client.celery.control.add_consumer("llm", destination=llm, reply=True)
    for thread in threads:
        thread.join(60)

    # Then each follower saw the step's llm.requested before any of its text
    for who, seen in (("early", early), ("late", late)):
        names = [e.name for e in seen]
        assert EventName.ASSISTANT_DELTA in names, (who, names)
        assert names.index(EventName.LLM_REQUESTED) < names.index(EventName.ASSISTANT_DELTA)
        assert names[-1] is EventName.TURN_COMPLETED
        # ... and every stored event once, in order
        stored = [e.seq for e in seen if e.seq is not None]
        assert stored == sorted(set(stored))
