"""The pure parts both clients share: argument checks, typed output, and a
follower's decisions (client_args.py, job_reads.py)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from orchestrator import client_args as args
from orchestrator.errors import InvalidRequestError, NoStructuredOutputError
from orchestrator.job_reads import Follow, HeldDeltas, JobIds, answer, typed_output
from schemas import Event, EventName, JobStatus, TurnStatus

JOB = JobIds("turn", "conv", "conv")


def event(name: EventName, seq: int | None, **data: Any) -> Event:
    return Event(
        name=name,
        conversation_id="conv",
        root_id="conv",
        turn_id="turn",
        correlation_id="corr",
        time=datetime.now(UTC),
        seq=seq,
        data=data,
    )


@pytest.mark.parametrize(
    ("check", "value", "field"),
    [
        (lambda v: args.valid_id(v, "job_id"), "", "job_id"),
        (lambda v: args.valid_id(v, "job_id"), "x" * 65, "job_id"),
        (lambda v: args.valid_id(v, "job_id"), 7, "job_id"),
        (args.conversation, "nul\x00", "conversation_id"),
        (args.timeout, -1, "timeout"),
        (args.timeout, float("nan"), "timeout"),
        (args.timeout, True, "timeout"),
        (args.since, -1, "since"),
        (args.since, 2**63, "since"),
        (lambda v: args.flag(v, "deltas"), "yes", "deltas"),
        (args.valid_tenant, "", "tenant"),
        (args.valid_tenant, "t" * 65, "tenant"),
        (args.valid_tenant, "nul\x00", "tenant"),
        # a job continuing a conversation belongs to its root's tenant
        (lambda v: args.job_request("quick", "hi", "conv", None, None, None, 5, v), "a", "tenant"),
    ],
)
def test_bad_arguments_name_their_field(check: Any, value: object, field: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check(value)
    assert caught.value.fields == [field]


def test_good_arguments_pass() -> None:
    assert args.valid_id("abc", "job_id") == "abc"
    assert args.timeout(None) is None and args.timeout(2) == 2.0
    assert args.timeout(10**400) == float("inf")
    assert args.since(None) == 0 and args.since(5) == 5


def test_requests_are_checked_as_submit_and_send_check_them() -> None:
    with pytest.raises(InvalidRequestError):
        args.job_request("quick", "hi", None, None, None, None, 42)
    with pytest.raises(InvalidRequestError):
        args.message_options(None, None, -1)
    request = args.job_request("quick", "hi", None, None, "k", None, 5)
    assert request.context_data == {} and request.idempotency_key == "k"
    assert request.tenant is None
    assert args.job_request("quick", "hi", None, None, None, None, 5, "acme").tenant == "acme"


class Trip(BaseModel):
    city: str
    nights: int


def status(structured: Any, agent: str = "travel") -> JobStatus:
    return JobStatus(
        job_id="turn",
        conversation_id="conv",
        root_id="conv",
        agent=agent,
        status=TurnStatus.COMPLETED,
        step=1,
        structured=structured,
    )


def test_typed_output_validates_into_the_given_model_or_returns_the_json() -> None:
    stored = {"city": "Lisbon", "nights": 3}
    assert typed_output(status(stored), Trip) == Trip(city="Lisbon", nights=3)
    assert typed_output(status(stored, agent="not-declared-here")) == stored
    with pytest.raises(NoStructuredOutputError, match="declares no output"):
        typed_output(status(None))
    with pytest.raises(InvalidRequestError, match="as Trip"):
        typed_output(status({"city": "Lisbon"}), Trip)


def test_the_answer_of_an_end_event_or_a_status() -> None:
    done = event(EventName.TURN_COMPLETED, 9, status="completed", output="hi")
    assert answer("turn", done) == "hi"
    failed = event(EventName.TURN_FAILED, 9, status="failed", error="boom")
    with pytest.raises(Exception, match="boom"):
        answer("turn", failed)


def test_a_follower_yields_stored_events_once_and_stops_at_the_end() -> None:
    follow = Follow(JOB, "corr", 0, HeldDeltas(None), deltas=True)
    started = event(EventName.TURN_STARTED, 1)
    end = event(EventName.TURN_COMPLETED, 5, status="completed")
    out, ended = follow.stored([started])
    assert out == [started] and not ended and follow.last == 1

    # a delta after an event announced live (seq 3) waits for that event
    delta = event(EventName.ASSISTANT_DELTA, None, text="he")
    due, stale = follow.live([event(EventName.LLM_REQUESTED, 3), delta])
    assert due == [] and stale and follow.behind()
    requested = event(EventName.LLM_REQUESTED, 3)
    out, ended = follow.stored([requested, end])
    assert out == [requested, delta, end] and ended

    # another turn's events (another correlation id) are not this follower's
    other = event(EventName.LLM_REQUESTED, 7).model_copy(update={"correlation_id": "x"})
    assert follow.live([other]) == ([], False)


def test_a_follower_without_deltas_drops_them() -> None:
    follow = Follow(JOB, "corr", 0, HeldDeltas(None), deltas=False)
    due, stale = follow.live([event(EventName.ASSISTANT_DELTA, None, text="x")])
    assert due == [] and not stale


def test_threads_using_a_new_client_at_once_share_what_it_makes(tmp_path: Path) -> None:
    # Given a new client (an embedded database; no task sent, nothing read yet)
    from orchestrator import Client, Settings
    from orchestrator.store.migrate import upgrade

    url = f"sqlite:///{tmp_path}/db"
    upgrade(url)
    client = Client(Settings(database_url=url, redis_url="redis://127.0.0.1:1"))
    # When 16 threads ask at once for its app and dispatcher, its live
    # reader and turn-end checker, and its runtime's Redis and pool
    gate = threading.Barrier(16)
    seen: list[tuple[int, ...]] = []

    def first_use() -> None:
        gate.wait()
        made = (client.celery, client.dispatcher, client.streams, client.ends)
        seen.append(tuple(map(id, (*made, client.runtime.redis, client.runtime.pool))))

    threads = [threading.Thread(target=first_use) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then all got the same ones (one app, one reader thread, one pool each)
    assert len(seen) == 16 and len(set(seen)) == 1
    client.close()


def test_made_once_makes_its_value_once_however_many_threads_ask_first() -> None:
    from orchestrator.lazy import made_once

    class Holder:
        made = 0

        @made_once
        def value(self) -> object:
            """A slow thing to make."""
            Holder.made += 1
            time.sleep(0.05)  # every thread arrives while the first makes it
            return object()

    holder, gate = Holder(), threading.Barrier(8)
    seen: list[object] = []

    def ask() -> None:
        gate.wait()
        seen.append(holder.value)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Holder.made == 1 and len({id(v) for v in seen}) == 1
    assert Holder.value.__doc__ == "A slow thing to make."
    holder.value = "set"  # like cached_property: an assignment replaces it
    assert holder.value == "set"
