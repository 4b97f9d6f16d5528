"""The sweeper tells late work from lost work, gives up on a position that
never moves, drops phantom broker messages and finds stranded queued
messages.

Each test runs on its own Redis key prefix (its own broker queues) with
its own worker processes, so the session's workers cannot serve its tasks.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Container, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, update
from sqlmodel import col, select

from orchestrator import Client, Job, Settings, engine
from orchestrator.celery_conf import queue_lists
from orchestrator.dispatch import dispatch
from orchestrator.engine.actions import Action, Dequeue, RunAdvance, RunSegment, RunStep
from orchestrator.engine.step import new_lease_owner
from orchestrator.errors import JobFailedError
from orchestrator.store.tables import Conversation, EventRow, ToolCallRow, Turn
from schemas import AgentSpec, EventName, JobRequest, RateLimit
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.integration

Private = Callable[..., tuple[Settings, Client]]

#: A worker of these tests: alone on its key prefix, it has no neighbour to
#: ask for revoked task ids at start (Celery's mingle waits a second for one).
ALONE = "--without-mingle"


@pytest.fixture
def private(settings: Settings) -> Iterator[Private]:
    """Settings and a client on a fresh key prefix (removed with the session's)."""
    clients: list[Client] = []

    def make(**overrides: Any) -> tuple[Settings, Client]:
        own = settings.model_copy(
            update={"redis_prefix": f"{settings.redis_prefix}-{uuid.uuid4().hex[:6]}", **overrides}
        )
        clients.append(Client(own))
        return own, clients[-1]

    yield make
    for c in clients:
        c.close()


def for_conversations(actions: Iterable[Action], conversation_ids: Container[str]) -> list[Action]:
    """The actions for these conversations: a sweep reads the whole
    database, which the session's other tests share (work they left, on
    another prefix, is not this test's)."""
    return [a for a in actions if getattr(a, "conversation_id", None) in conversation_ids]


class Sweeper:
    """Runs the sweep the way ``chorus.sweep`` does, keeping what it sent."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.sent: list[Action] = []

    def once(self) -> list[Action]:
        actions = engine.sweep(self.client.runtime)
        dispatch(self.client.celery, actions)
        self.sent.extend(actions)
        return actions

    def sent_for(self, *conversation_ids: str) -> list[Action]:
        """What it sent for these conversations (:func:`for_conversations`)."""
        return for_conversations(self.sent, conversation_ids)


@contextmanager
def sweeping(client: Client, every: float = 0.3) -> Iterator[Sweeper]:
    sweeper = Sweeper(client)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            sweeper.once()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield sweeper
    finally:
        stop.set()
        thread.join(30)


@contextmanager
def running(*workers: WorkerProcess, client: Client) -> Iterator[None]:
    try:
        for w in workers:
            w.wait_ready(client)
        yield
    finally:
        for w in workers:
            w.stop()


def _lists(client: Client, queue: str) -> list[str]:
    """The Redis keys of ``queue``'s messages, one list per priority."""
    return [f"{client.settings.redis_prefix}:{name}" for name in queue_lists(queue)]


def _unacked_task_ids(client: Client) -> set[str]:
    stored = client.runtime.redis.hgetall(f"{client.settings.redis_prefix}:unacked")
    return {json.loads(v)[0]["headers"]["id"] for v in stored.values()}  # type: ignore[union-attr]


def _model_calls_per_step(client: Client, turn_ids: list[str]) -> list[int]:
    with client.runtime.session() as s:
        rows = s.exec(
            select(EventRow.turn_id, EventRow.step, func.count())
            .where(
                EventRow.name == EventName.LLM_REQUESTED.value,
                EventRow.turn_id.in_(turn_ids),  # type: ignore[union-attr]
            )
            .group_by(EventRow.turn_id, EventRow.step)
        ).all()
    return [n for _turn, _step, n in rows]


@pytest.mark.long
def test_work_waiting_in_busy_queues_or_held_until_its_countdown_is_not_re_dispatched(
    private: Private,
) -> None:
    # Three kinds of late work, in one fleet (they share its queues, and each
    # is over two stall timeouts late):
    # Given a 2-slot llm worker, a 2-process tools worker and a stall timeout of 3 s
    settings, client = private(stall_timeout=3.0)
    llm = WorkerProcess(
        settings, "busy-llm", "-Q", "llm,control", "-P", "threads", "-c", "2", ALONE
    )
    tools = WorkerProcess(settings, "busy-tools", "-Q", "tools", "-P", "prefork", "-c", "2", ALONE)
    # and one model call per 4.5 s for a tenant (sweep-deferred's script, its
    # period shortened)
    tenant = {"tenant": uuid.uuid4().hex}
    deferred_agent = AgentSpec(
        name="sweep-deferred",
        model="scripted/sweep-deferred",
        rate_limits=(RateLimit(key="tenant:{tenant}", requests=1, period=4.5),),
    )
    with running(llm, tools, client=client), sweeping(client) as sweeper:
        # When 5 jobs of two 2-second tool calls each queue up (the last calls
        # wait about 8 s in the tools queue),
        batches = [client.submit("fragile-batch", f"b{i}") for i in range(5)]
        # three jobs of the tenant arrive at once (the last is deferred about
        # 9 s, its task held by the worker until its countdown ends),
        deferred = [client.submit(deferred_agent, f"d{i}", context_data=tenant) for i in range(3)]
        # and 26 jobs of a 0.5 s model queue up (the last waits about 6.5 s)
        slow = [client.submit("sweep-slow", f"q{i}") for i in range(26)]
        slow_answers = [job.result(timeout=180) for job in slow]
        deferred_answers = [job.result(timeout=120) for job in deferred]
        for job in batches:
            job.result(timeout=180)

    # Then each completes, and the sweeper sent nothing
    assert slow_answers == [f"slow: q{i}" for i in range(26)]
    assert sorted(deferred_answers) == [f"deferred: d{i}" for i in range(3)]
    assert sweeper.sent_for(*(job.conversation_id for job in [*batches, *deferred, *slow])) == []
    # and every call and model step ran once
    calls = [c for job in batches for c in _calls(client, job.id)]
    assert len(calls) == 10
    assert all(c.status == "completed" and c.attempts == 1 for c in calls)
    assert _model_calls_per_step(client, [j.id for j in slow]) == [1] * 26
    assert _model_calls_per_step(client, [j.id for j in deferred]) == [1] * 3
    assert _model_calls_per_step(client, [j.id for j in batches]) == [1] * 10


def test_a_position_lost_every_time_fails_its_turn(private: Private) -> None:
    # Given no worker on this prefix, so every step task sent is lost (purged),
    # and a stall timeout of 0.5 s (the re-sends back off 0.5, 1, 2 and 4 s)
    _settings, client = private(stall_timeout=0.5, max_redispatches=3)
    llm_queue = _lists(client, "llm")
    job = client.submit("quick", "never answered")
    client.runtime.redis.delete(*llm_queue)

    # When the sweeper runs until the turn ends, each of its copies lost too
    sweeper = Sweeper(client)
    deadline = time.monotonic() + 90
    while client.job(job.id).status().status.value == "running":
        assert time.monotonic() < deadline, "the turn never ended"
        sweeper.once()
        client.runtime.redis.delete(*llm_queue)
        time.sleep(0.1)

    # Then it re-sent the step max_redispatches times, backing off, and failed
    # the turn (whose end lets the conversation's next message start)
    own = job.conversation_id  # other tests' turns share the database (see below)
    sent = [a for a in sweeper.sent if getattr(a, "conversation_id", own) == own]
    assert [type(a) for a in sent] == [RunStep] * 3 + [Dequeue]
    with pytest.raises(JobFailedError, match="no progress after 3 re-dispatches"):
        job.result(timeout=5)
    names = [e.name for e in job.events(timeout=5)]
    assert names[-1] == EventName.TURN_FAILED


def test_a_child_given_up_on_answers_its_parent(private: Private) -> None:
    # Given a lead whose subagent's first step is lost every time (the engine
    # is driven directly and the child's step is never run)
    _settings, client = private(stall_timeout=1.0, max_redispatches=1)
    rt = client.runtime
    ref, _ = engine.start_turn(rt, JobRequest(agent="careful-lead", input="go"))
    (segment,) = engine.run_step(rt, ref.conversation_id, ref.job_id, 0, new_lease_owner())
    assert isinstance(segment, RunSegment)
    for call in segment.calls:
        engine.run_tool(rt, call.call_id)  # ``add`` answers; the child starts, its step is lost

    # When the sweeper re-sends the child's step (lost again) and then gives up
    # (counting only what it sends for this tree: the session's database also
    # holds other tests' conversations, which this private sweeper sees too)
    with rt.session() as session:
        tree = set(
            session.exec(
                select(Conversation.id).where(Conversation.root_id == ref.conversation_id)
            ).all()
        )
    assert len(tree) == 2, tree
    sent: list[Action] = []
    deadline = time.monotonic() + 60
    while not any(isinstance(a, RunAdvance) for a in sent):
        assert time.monotonic() < deadline, "the sweeper never gave up on the child"
        sent.extend(for_conversations(engine.sweep(rt), tree))
        time.sleep(0.2)

    # Then the child's turn failed, and its failure is the parent's tool result
    assert [type(a) for a in sent] == [RunStep, RunAdvance]
    (advance,) = [a for a in sent if isinstance(a, RunAdvance)]
    (step,) = engine.advance(rt, advance.conversation_id, advance.turn_id, 0, 0)
    assert isinstance(step, RunStep)
    engine.run_step(rt, ref.conversation_id, ref.job_id, 1, new_lease_owner())
    job = client.job(ref.job_id)
    answer = job.result(timeout=5)
    assert "no progress after 1 re-dispatches" in answer and "3" in answer
    calls = _calls(client, ref.job_id)
    child = next(c for c in calls if c.tool == "subagent__failing-child")
    assert child.status == "failed" and child.is_error


def test_a_step_waiting_in_an_unserved_queue_is_left_alone(private: Private) -> None:
    # Given a step whose task waits in a queue no worker consumes
    _settings, client = private(stall_timeout=1.0)
    job = client.submit("quick", "waiting")
    sweeper = Sweeper(client)

    # When the sweeper runs for well past several stall timeouts
    end = time.monotonic() + 4
    while time.monotonic() < end:
        sweeper.once()
        time.sleep(0.2)

    # Then it sent nothing for it: the task is late, not lost. (The session's
    # database also holds other tests' turns, whose tasks wait under the
    # session's key prefix, not this private one: to this sweeper they look
    # lost, as a deployment never sees: only actions naming another
    # conversation are left out.)
    own = job.conversation_id
    assert [a for a in sweeper.sent if getattr(a, "conversation_id", own) == own] == []
    assert client.job(job.id).status().status.value == "running"


@pytest.mark.long
def test_stale_unacked_messages_of_finished_work_are_dropped(private: Private) -> None:
    # Given a batch running on a tools worker, and a spare worker started
    # beside it that reads no tools queue yet (control only)
    settings, client = private(stall_timeout=2.0)
    llm = WorkerProcess(settings, "sw-llm", "-Q", "llm,control", "-P", "threads", "-c", "4", ALONE)
    tools = WorkerProcess(settings, "sw-tools", "-Q", "tools", "-P", "prefork", "-c", "2", ALONE)
    spare = WorkerProcess(settings, "sw-tools2", "-Q", "control", "-P", "prefork", "-c", "2", ALONE)
    try:
        with running(llm, tools, client=client):
            spare.wait_ready(client)
            job = client.submit("fragile-batch", "go")
            deadline = time.monotonic() + 60
            while sum(c.status == "running" for c in _calls(client, job.id)) < 2:
                assert time.monotonic() < deadline, "the batch never started"
                time.sleep(0.05)

            # When the whole tools worker is SIGKILLed: its messages stay unacked
            os.killpg(tools.proc.pid, signal.SIGKILL)
            tools.proc.wait(10)
            call_ids = {c.id for c in _calls(client, job.id)}
            assert call_ids <= _unacked_task_ids(client)
            # (the spare now reads the tools queue)
            control = client.celery.control
            assert control.add_consumer("tools", destination=[spare.name], reply=True)

            # and the sweeper recovers the batch
            with sweeping(client):
                job.result(timeout=120)
                # Then once they are older than the stall timeout, the dead
                # worker's messages are gone (nothing is redelivered later)
                # and no other message is left unacknowledged
                deadline = time.monotonic() + 60
                while _unacked_task_ids(client):
                    assert time.monotonic() < deadline, _unacked_task_ids(client)
                    time.sleep(0.3)
    finally:
        spare.stop()
    assert all(c.status == "completed" for c in _calls(client, job.id))


def _calls(client: Client, turn_id: str) -> list[ToolCallRow]:
    with client.runtime.session() as s:
        return list(s.exec(select(ToolCallRow).where(ToolCallRow.turn_id == turn_id)).all())


def _turns(client: Client, conversation_id: str) -> list[Turn]:
    with client.runtime.session() as s:
        return list(s.exec(select(Turn).where(Turn.conversation_id == conversation_id)).all())


def _lose_dequeues(client: Client) -> None:
    client.runtime.redis.delete(*_lists(client, "control"))


@pytest.mark.long
def test_a_message_whose_dequeue_was_lost_starts_one_turn(private: Private) -> None:
    # Given an idle conversation, and no worker consuming the control queue
    settings, client = private(stall_timeout=1.0)
    worker = WorkerProcess(settings, "sw-all", "-Q", "llm", "-P", "threads", "-c", "2", ALONE)
    with running(worker, client=client):
        first = client.submit("quick", "hello")
        first.result(timeout=60)
        conversation_id = first.conversation_id
        _lose_dequeues(client)

        # When a message is sent and its dequeue is lost
        entry = client.send(conversation_id, "are you there?")
        _lose_dequeues(client)

        # (the worker reads the control queue from then on)
        control = client.celery.control
        assert control.add_consumer("control", destination=[worker.name], reply=True)
        with sweeping(client) as sweeper:
            # Then the sweeper dequeues it and it starts exactly one turn
            deadline = time.monotonic() + 60
            while (job := client.job_for_message(conversation_id, entry)) is None:
                assert time.monotonic() < deadline, "the message was never dequeued"
                time.sleep(0.2)
            assert job.result(timeout=60) == "ok: are you there?"
            time.sleep(3)  # more sweeps start nothing more
    assert any(isinstance(a, Dequeue) for a in sweeper.sent)
    assert len(_turns(client, conversation_id)) == 2


@pytest.mark.long
def test_messages_lost_with_redis_data_are_re_queued_from_postgres(private: Private) -> None:
    # Given a busy conversation with two queued messages, and no worker at all
    settings, client = private(stall_timeout=1.0)
    job = client.submit("quick", "first")
    conversation_id = job.conversation_id
    entries = [client.send(conversation_id, text) for text in ("second", "third")]

    # When Redis loses everything under the prefix (restarted without persistence)
    redis = client.runtime.redis
    keys = list(redis.scan_iter(match=f"{settings.redis_prefix}:*"))
    redis.delete(*keys)

    # Then, with a worker and the sweeper, the turn is re-run and each message
    # starts exactly one turn, in order
    worker = WorkerProcess(
        settings, "sw-all", "-Q", "llm,control", "-P", "threads", "-c", "2", ALONE
    )
    with running(worker, client=client), sweeping(client):
        assert job.result(timeout=90) == "ok: first"
        found = []
        for entry in entries:
            deadline = time.monotonic() + 60
            while (queued := client.job_for_message(conversation_id, entry)) is None:
                assert time.monotonic() < deadline, "a queued message was lost"
                time.sleep(0.2)
            found.append(queued.result(timeout=60))
        time.sleep(3)
    assert found == ["ok: second", "ok: third"]
    assert len(_turns(client, conversation_id)) == 3


def _lost_steps(client: Client, redispatches: int = 0) -> list[Job]:
    """20 jobs whose first step task was lost (no worker on this prefix; the
    queue purged), stalled for an hour, re-dispatched ``redispatches`` times."""
    jobs = [client.submit("quick", f"lost {i}") for i in range(20)]
    client.runtime.redis.delete(*_lists(client, "llm"))
    with client.runtime.session() as s:
        s.execute(
            update(Conversation)
            .where(col(Conversation.id).in_([job.conversation_id for job in jobs]))
            .values(progress_at=func.now() - timedelta(hours=1), redispatches=redispatches)
        )
        s.commit()
    return jobs


def _two_sweeps_at_once(client: Client, own: set[str]) -> list[Action]:
    """What two sweepers (two beat replicas) sweeping at the same moment
    return for these conversations."""
    start = threading.Barrier(2)
    found: list[list[Action]] = [[], []]

    def sweep(into: list[Action]) -> None:
        start.wait()
        into.extend(for_conversations(engine.sweep(client.runtime), own))

    threads = [threading.Thread(target=sweep, args=(into,)) for into in found]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return [a for into in found for a in into]


def test_two_sweepers_at_once_re_dispatch_each_lost_step_once(private: Private) -> None:
    # Given 20 jobs whose first step was lost
    _settings, client = private(stall_timeout=2.0)
    own = {job.conversation_id for job in _lost_steps(client)}

    # When two sweepers sweep at the same moment, a few times
    sent = [a for _ in range(3) for a in _two_sweeps_at_once(client, own)]

    # Then each lost step was re-dispatched exactly once, by one of them
    assert sorted(a.conversation_id for a in sent) == sorted(own)
    assert all(isinstance(a, RunStep) for a in sent)
    with client.runtime.session() as s:
        counts = s.exec(select(Conversation.redispatches).where(col(Conversation.id).in_(own)))
        assert list(counts) == [1] * 20


def test_two_sweepers_at_once_give_up_on_each_stuck_step_once(private: Private) -> None:
    # Given 20 jobs whose first step was lost as often as the sweeper re-sends it
    _settings, client = private(stall_timeout=2.0, max_redispatches=2)
    jobs = _lost_steps(client, redispatches=2)

    # When two sweepers sweep at the same moment
    _two_sweeps_at_once(client, {job.conversation_id for job in jobs})

    # Then each turn failed once, one way
    for job in jobs:
        names = [e.name for e in job.events(deltas=False, timeout=5)]
        assert names.count(EventName.TURN_FAILED) == 1, names
        with pytest.raises(JobFailedError, match="no progress after 2 re-dispatches"):
            job.result(timeout=5)
