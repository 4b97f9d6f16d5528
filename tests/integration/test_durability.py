"""Crashes and duplicates: a killed worker process costs a delay, never a result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError
from sqlmodel import col, select

from orchestrator import Client, engine
from orchestrator.engine import step as step_module
from orchestrator.engine.actions import RunSegment, RunStep
from orchestrator.engine.persist import load_owned
from orchestrator.engine.step import LeaseOwner, _take_lease, new_lease_owner
from orchestrator.runtime import Runtime
from orchestrator.store.step_sql import HANDED_ON
from orchestrator.store.tables import Conversation, EventRow, MessageRow, ToolCallRow
from schemas import EventName, JobRequest
from tests.conftest import ROOT, TOOLS_WORKER, WorkerProcess, tool_calls, worker_env

pytestmark = pytest.mark.integration


def _running_calls(client: Client, turn_id: str) -> list[ToolCallRow]:
    with client.runtime.session() as s:
        return list(
            s.exec(
                select(ToolCallRow).where(
                    ToolCallRow.turn_id == turn_id, ToolCallRow.status == "running"
                )
            ).all()
        )


def test_sigkill_of_a_tool_process_mid_batch(
    client: Client, workers: dict[str, WorkerProcess]
) -> None:
    # Given a batch of three 4-second tools running in the prefork tools worker
    job = client.submit("slow-batch", "go")
    deadline = time.monotonic() + 30
    while len(_running_calls(client, job.id)) < 3:
        assert time.monotonic() < deadline, "the batch never started"
        time.sleep(0.1)

    # When the pool's processes are killed outright, mid-call
    victims = workers["tools"].children()
    assert victims
    for pid in victims:
        os.kill(pid, signal.SIGKILL)

    # Then the turn still completes, with exactly one result row per call
    answer = job.result(timeout=90)
    calls = tool_calls(client, job.id)
    assert len(calls) == 3
    assert all(c.status == "completed" for c in calls)
    assert sorted(c.result["label"] for c in calls) == ["s0", "s1", "s2"]
    assert all(c.result["label"] in answer for c in calls)
    # and each killed call really ran again
    assert [c.attempts for c in calls] == [2, 2, 2]
    # the worker replaced its process and still serves
    assert client.submit("trip-planner", "after the crash").result(timeout=60)


def test_two_concurrent_advances_move_the_cursor_once(client: Client) -> None:
    # Given a turn whose tool segment has every result (engine called directly)
    rt = client.runtime
    ref, actions = engine.start_turn(rt, JobRequest(agent="trip-planner", input="race"))
    (step,) = actions
    assert isinstance(step, RunStep)
    (segment,) = engine.run_step(rt, ref.conversation_id, ref.job_id, 0, new_lease_owner())
    assert isinstance(segment, RunSegment) and len(segment.calls) == 3
    for call in segment.calls:
        engine.run_tool(rt, call.call_id)
        engine.run_tool(rt, call.call_id)  # a redelivered copy records nothing more
    with rt.session() as s:
        version = s.get(Conversation, ref.conversation_id).version  # type: ignore[union-attr]

    # When two copies of advance race
    gate = threading.Barrier(2)
    results: list[list[Any]] = []

    def race() -> None:
        gate.wait()
        results.append(engine.advance(rt, ref.conversation_id, ref.job_id, 0, 0))

    threads = [threading.Thread(target=race) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # Then exactly one advanced
    assert sorted(len(r) for r in results) == [0, 1]
    with rt.session() as s:
        conv = s.get(Conversation, ref.conversation_id)
        assert conv is not None and conv.version == version + 1 and conv.cursor_segment == 1
        calls = s.exec(select(ToolCallRow).where(ToolCallRow.turn_id == ref.job_id)).all()
        assert [c.attempts for c in calls if c.segment == 0] == [1, 1, 1]
    # and a later segment's advance racing too moves once, storing one results message
    (barrier,) = next(r for r in results if r)
    engine.run_tool(rt, barrier.calls[0].call_id)
    outcomes = [engine.advance(rt, ref.conversation_id, ref.job_id, 0, 1) for _ in range(2)]
    assert [len(o) for o in outcomes] == [1, 0]
    with rt.session() as s:
        kinds = s.exec(select(MessageRow.kind).where(MessageRow.turn_id == ref.job_id)).all()
    assert sorted(kinds) == ["assistant", "input", "tool_results"]


def _held_step(rt: Runtime, text: str) -> tuple[tuple[str, str, int], LeaseOwner]:
    """A trip-planner turn whose step 0 an execution (returned) leased, as
    one whose database failed mid-call leaves it: still held."""
    ref, _ = engine.start_turn(rt, JobRequest(agent="trip-planner", input=text))
    ids = (ref.conversation_id, ref.job_id, 0)
    held = new_lease_owner()
    assert _take_lease(rt, ids, held) is not None
    return ids, held


def _lease_and_calls(rt: Runtime, ids: tuple[str, str, int]) -> tuple[str | None, str, int]:
    """The lease's owner, the conversation's state and the model calls
    requested (``llm.requested``) for the turn."""
    with rt.session() as s:
        conv = s.get(Conversation, ids[0])
        assert conv is not None
        requested = s.exec(
            select(EventRow).where(
                EventRow.turn_id == ids[1], EventRow.name == EventName.LLM_REQUESTED.value
            )
        ).all()
        return conv.lease_owner, conv.state, len(requested)


def test_a_forged_previous_owner_neither_takes_a_live_lease_nor_fails_its_turn(
    client: Client,
) -> None:
    # Given a step whose lease a live execution holds
    rt = client.runtime
    ids, live = _held_step(rt, "forged")
    # When copies of it run with the previous owner a hostile broker message
    # may carry: a non-string, a huge string, a NUL (which Postgres refuses:
    # its error failed the turn), an empty one, near misses of the live id
    forged: list[object] = [7, ["x"], "x" * 5_000_000, "a\x00b", "", live.id.upper(), live.id + " "]
    for previous in forged:
        # Then each leaves without raising or calling the model
        assert engine.run_step(rt, *ids, new_lease_owner(previous)) == []
        # and the lease stays the live execution's, its turn running
        assert _lease_and_calls(rt, ids) == (live.id, "running", 0), repr(previous)[:40]


def test_two_copies_of_a_retry_call_the_model_once(client: Client) -> None:
    # Given a step whose execution failed holding the lease
    rt = client.runtime
    ids, failed = _held_step(rt, "two retries")
    # When two copies of its retry (a redelivery) take it over at once
    gate = threading.Barrier(2)
    results: list[list[Any]] = []

    def retry() -> None:
        gate.wait()
        results.append(engine.run_step(rt, *ids, new_lease_owner(failed.holder)))

    threads = [threading.Thread(target=retry) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then one called the model and stored its reply, the other left
    assert sorted(len(r) for r in results) == [0, 1]
    assert isinstance(next(r for r in results if r)[0], RunSegment)
    owner, state, calls = _lease_and_calls(rt, ids)
    assert (owner, state, calls) == (None, "running", 1)
    with rt.session() as s:
        replies = s.exec(
            select(MessageRow).where(MessageRow.turn_id == ids[1], MessageRow.kind == "assistant")
        ).all()
    assert len(replies) == 1


def _database_down(*_args: Any) -> None:
    raise OperationalError("UPDATE chorus_conversation", {}, ConnectionError("server down"))


def test_a_retry_chain_hands_the_lease_on_past_retries_that_failed_before_taking_it(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a step whose execution failed holding the lease
    rt = client.runtime
    ids, failed = _held_step(rt, "a chain")
    real_take = step_module.take_lease

    # When its first two retries fail as they take it (the database still down)
    monkeypatch.setattr(step_module, "take_lease", _database_down)
    holder = failed.holder
    for _ in range(2):
        retry = new_lease_owner(holder)
        with pytest.raises(OperationalError):
            engine.run_step(rt, *ids, retry)
        holder = retry.holder
        # Then each hands on the failed execution's lease, still held (and
        # its own: it cannot know whether its take committed)
        assert holder is not None and failed.id in holder.split(",")
        assert _lease_and_calls(rt, ids)[0] == failed.id
    # and the next, the database back, takes it over and stores the step
    monkeypatch.setattr(step_module, "take_lease", real_take)
    (segment,) = engine.run_step(rt, *ids, new_lease_owner(holder))
    assert isinstance(segment, RunSegment)
    assert _lease_and_calls(rt, ids) == (None, "running", 1)
    # while a stale copy of any of them, or the failed execution, stores nothing more
    assert engine.run_step(rt, *ids, new_lease_owner(failed.id)) == []
    with rt.session() as s:
        assert load_owned(s, *ids, failed.id) is None
        steps = s.exec(select(col(MessageRow.kind)).where(MessageRow.turn_id == ids[1])).all()
    assert sorted(steps) == ["assistant", "input"]


def test_sweeper_recovers_a_turn_whose_worker_died_whole(
    settings: Any, client: Client, workers: dict[str, WorkerProcess]
) -> None:
    # Given beat running the sweeper, and a batch running on the tools worker
    # (its replacement, like it but reading an idle queue, starts meanwhile)
    standby = f"standby-{uuid.uuid4().hex[:6]}"
    spare_args = [a if a != "tools" else standby for a in TOOLS_WORKER]
    spare = WorkerProcess(settings, "tools2", *spare_args)
    beat = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "beat", "-l", "WARNING"],
        cwd=ROOT,
        env=worker_env(settings),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        job = client.submit("fragile-batch", "go")
        deadline = time.monotonic() + 30
        while len(_running_calls(client, job.id)) < 2:
            assert time.monotonic() < deadline, "the batch never started"
            time.sleep(0.05)

        # When the whole worker (main process and pool) is SIGKILLed: its
        # unacked messages stay invisible in Redis for the visibility timeout
        os.killpg(workers["tools"].proc.pid, signal.SIGKILL)
        workers["tools"].proc.wait(10)
        # (its replacement takes its place: it reads the tools queue alone)
        workers["tools"] = spare
        spare.wait_ready(client, timeout=120)
        control = client.celery.control
        assert control.add_consumer("tools", destination=[spare.name], reply=True)
        assert control.cancel_consumer(standby, destination=[spare.name], reply=True)

        # Then the sweeper re-dispatches the stalled segment and the turn completes
        answer = job.result(timeout=90)
    finally:
        beat.terminate()
        beat.wait(10)
        if workers["tools"] is not spare:  # it never took the old one's place
            spare.stop()
    calls = tool_calls(client, job.id)
    assert sorted(c.result["label"] for c in calls) == ["f0", "f1"]
    assert all(c.status == "completed" and c.attempts == 2 for c in calls)
    assert "f0" in answer and "f1" in answer


def test_a_take_that_committed_but_lost_its_reply_is_taken_over_by_the_retry(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a step whose execution failed holding the lease
    rt = client.runtime
    ids, failed = _held_step(rt, "lost reply")
    real_take = step_module.take_lease

    def committed_then_lost(*args: Any) -> None:
        real_take(*args)  # the UPDATE commits on its own (autocommit) ...
        raise OperationalError("UPDATE chorus_conversation", {}, ConnectionError("reset"))

    # When its retry's take commits but the reply is lost, and the database
    # stays away while the retry tries to give the lease up
    monkeypatch.setattr(step_module, "take_lease", committed_then_lost)
    monkeypatch.setattr(step_module, "release_lease", _database_down)
    retry = new_lease_owner(failed.holder)
    with pytest.raises(OperationalError):
        engine.run_step(rt, *ids, retry)
    # Then the lease is the retry's, and the retry hands it on
    assert _lease_and_calls(rt, ids)[0] == retry.id
    assert retry.holder is not None and retry.id in retry.holder.split(",")
    # and the next retry takes it over at once and stores the step
    monkeypatch.undo()
    (segment,) = engine.run_step(rt, *ids, new_lease_owner(retry.holder))
    assert isinstance(segment, RunSegment)
    assert _lease_and_calls(rt, ids) == (None, "running", 1)


def test_a_handed_on_list_of_owners_is_bounded_and_checked() -> None:
    ids = [new_lease_owner().id for _ in range(HANDED_ON + 1)]
    # the most a retry hands on is taken; one more, or any malformed part, is ignored
    assert new_lease_owner(",".join(ids[:HANDED_ON])).previous == tuple(ids[:HANDED_ON])
    for forged in (",".join(ids), ids[0] + ",", "," + ids[0], ids[0] + ", " + ids[1]):
        assert new_lease_owner(forged).previous == ()
    # and a chain of failed takes keeps the newest HANDED_ON
    owner = new_lease_owner(",".join(ids[:HANDED_ON]))
    owner.taken = None
    assert owner.holder == ",".join([owner.id, *ids[: HANDED_ON - 1]])
