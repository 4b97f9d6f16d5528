"""A model call holds its lease for as long as it runs, streaming or silent;
a reply that lost its lease is not stored, but its usage is counted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlmodel import col, select

from orchestrator import Client, Settings
from orchestrator.store.tables import Conversation, EventRow, utcnow
from schemas import AgentSpec, EventName
from tests.faults import ONE_WORKER, PrivateCluster, isolated_settings, running_fleet, wait_turns
from tests.fleet import llm_fleet
from tests.loopback_llm import LoopbackLLM
from tests.services import Services

pytestmark = pytest.mark.integration

LEASE = 6.0  # the fleet's model-call lease
STALL = 4.0  # the fleet's stall timeout (its heartbeat renews every STALL / 3 s)
SILENCE = 13.0  # the provider sends nothing at all for this long
LATE = 7.0  # a superseded call answers after this long (the sweeper's copy first)


@pytest.fixture(scope="module")
def short_lease(settings: Settings, services: Any) -> Iterator[tuple[Settings, Client]]:
    """A fleet (worker and beat) whose lease is ``LEASE`` and stall timeout ``STALL``."""
    fast = settings.model_copy(
        update={
            "redis_prefix": f"{settings.redis_prefix}-lease",
            "stall_timeout": STALL,
            "sweep_interval": 1.0,
            "lease_seconds": LEASE,
        }
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHORUS_LEASE_SECONDS", str(LEASE))
        with llm_fleet(fast, "lease-llm") as client:
            yield fast, client


def _agent(server: LoopbackLLM) -> AgentSpec:
    return AgentSpec(
        name="silent-thinker",
        model="openai/loopback-model",
        model_settings={"api_base": server.base_url},
    )


@pytest.mark.long
def test_a_model_call_silent_longer_than_the_lease_is_made_once(
    short_lease: tuple[Settings, Client],
) -> None:
    fast, client = short_lease
    assert fast.lease_seconds + fast.stall_timeout + 2 * fast.sweep_interval < SILENCE
    with LoopbackLLM() as server:
        # Given a provider that thinks silently (no chunk, not even headers)
        # for longer than the lease and the stall timeout, with the sweeper on
        server.enqueue_text("Worth the wait.", delay=SILENCE)

        # When the fleet runs the turn
        job = client.submit(_agent(server), "think hard")
        answer = job.result(timeout=120)

        # Then the provider was asked once, and the job completed with its answer
        assert answer == "Worth the wait."
        assert len(server.requests) == 1
    events = list(job.events(deltas=False, timeout=5))
    assert len([e for e in events if e.name is EventName.LLM_REQUESTED]) == 1
    usage = [e for e in events if e.name is EventName.USAGE]
    assert len(usage) == 1 and not usage[0].data.get("superseded")


@pytest.mark.parametrize("late", ["text", "tool calls"])
def test_a_reply_whose_lease_was_taken_is_not_stored_but_its_usage_counts(
    short_lease: tuple[Settings, Client], late: str
) -> None:
    _, client = short_lease
    with LoopbackLLM() as server:
        # Given a slow first call (an answer, or a batch of tools to run,
        # which a step stores in one statement), and an answer for whoever
        # calls next
        if late == "text":
            server.enqueue_text("Too late.", delay=LATE, usage=(100, 7))
        else:
            calls = [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]
            server.enqueue_tool_calls(calls, delay=LATE, usage=(100, 7))
        server.enqueue_text("On time.", usage=(50, 3))
        spec = _agent(server)
        job = client.submit(spec.model_copy(update={"tools": ("add",)}), "hi")
        deadline = time.monotonic() + 30
        while not server.received:
            assert time.monotonic() < deadline, "the model was never called"
            time.sleep(0.05)

        # When another owner takes the lease while the first call runs (as a
        # copy does when this one was paused past its lease), then lets it lapse
        with client.runtime.session() as s:
            s.execute(
                update(Conversation)
                .where(col(Conversation.id) == job.conversation_id)
                .values(lease_owner="another-copy", lease_until=utcnow() + timedelta(seconds=1))
            )

        # Then the sweeper's copy answers, and the first reply is not stored
        assert job.result(timeout=60) == "On time."
        deadline = time.monotonic() + 30
        while job.status().tree_usage.output_tokens < 10:
            assert time.monotonic() < deadline, "the superseded call's usage was not counted"
            time.sleep(0.2)
    assert len(server.requests) == 2
    status = job.status()
    assert (status.usage.input_tokens, status.usage.output_tokens) == (50, 3)
    assert (status.tree_usage.input_tokens, status.tree_usage.output_tokens) == (150, 10)
    with client.runtime.session() as s:
        rows = s.exec(
            select(EventRow).where(
                EventRow.turn_id == job.id, EventRow.name == EventName.USAGE.value
            )
        ).all()
    assert sorted((r.data["output_tokens"], bool(r.data.get("superseded"))) for r in rows) == [
        (3, False),
        (7, True),
    ]
    # and nothing of the late reply was stored: no message, no call, no event
    assert [m.role for m in client.history(job.conversation_id)] == ["user", "assistant"]
    events = list(job.events(deltas=False, timeout=5))
    assert not [e for e in events if e.name is EventName.TOOL_REQUESTED]
    assert [e.data["text"] for e in events if e.name is EventName.ASSISTANT_MESSAGE] == ["On time."]


#: A lease that outlives the outage below with one renewal to spare (the
#: heartbeat renews every STALL / 3 s).
OUTAGE_LEASE = 9.0
OUTAGE = 3.0  # Postgres is down this long (stopping and starting take ~2 s more)


@pytest.mark.long
@pytest.mark.timeout(240)
def test_the_heartbeat_keeps_a_lease_through_a_postgres_outage_shorter_than_it(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a fleet on a Postgres of its own, whose lease outlives a short outage
    monkeypatch.setenv("CHORUS_LEASE_SECONDS", str(OUTAGE_LEASE))
    with (
        PrivateCluster() as cluster,
        isolated_settings(
            services, tmp_path, database_url=cluster.url, stall_timeout=STALL, sweep_interval=1.0
        ) as settings,
        running_fleet(settings, ONE_WORKER) as (client, fleet),
        LoopbackLLM() as server,
    ):
        # and a provider that thinks silently for 16 s
        server.enqueue_text("Worth the wait.", delay=16.0)
        job = client.submit(_agent(server), "think through an outage")
        deadline = time.monotonic() + 60
        while not server.received:
            assert time.monotonic() < deadline, "the model was never called"
            time.sleep(0.05)

        # When Postgres stops during the call and starts again 3 s later
        time.sleep(1.0)
        cluster.stop()
        time.sleep(OUTAGE)
        cluster.start()

        # Then the heartbeat, whose renewals failed meanwhile, renews again in
        # time: the provider was asked once, and the job completed
        wait_turns(client, [job.conversation_id], 1, timeout=90)
        assert job.result(timeout=30) == "Worth the wait."
        assert len(server.received) == 1
        log = fleet.procs["all"].log_path.read_text(errors="replace")
    assert "could not renew model-call leases" in log
