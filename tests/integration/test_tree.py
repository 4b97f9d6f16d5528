"""The conversation tree: subagents, queued messages, cancellation, operations."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
from sqlmodel import col, select

from orchestrator import Client, ConversationBusyError, InvalidRequestError, Job, engine
from orchestrator.dispatch import dispatch
from orchestrator.engine import inbox
from orchestrator.store.tables import Conversation, EventRow, ToolCallRow, Turn
from schemas import EventName, JobRequest, Message, Role, TextBlock, TurnStatus
from tests.agents import FANOUT
from tests.conftest import tool_calls

pytestmark = pytest.mark.integration


def _turns(client: Client, **where: Any) -> list[Turn]:
    with client.runtime.session() as s:
        query = select(Turn)
        for key, value in where.items():
            query = query.where(getattr(Turn, key) == value)
        return list(s.exec(query.order_by(col(Turn.started_at))).all())


def _job_for(client: Client, conversation_id: str, entry: str, timeout: float = 60) -> Job:
    """Wait for the turn a sent message starts."""
    deadline = time.monotonic() + timeout
    while (job := client.job_for_message(conversation_id, entry)) is None:
        assert time.monotonic() < deadline, f"message {entry} never started a turn"
        time.sleep(0.1)
    return job


def test_parallel_subagents_with_a_nested_one(client: Client, workers: Any) -> None:
    # Given a lead agent delegating to three subagents, one of which delegates again
    job = client.submit("lead", "research three things")

    # When the fleet runs the tree
    events = list(job.events(timeout=90, deltas=False))
    answer = job.result(timeout=5)

    # Then the answer uses every child's result
    assert "researched alpha" in answer and "researched beta" in answer
    assert "deep: researched inner gamma" in answer
    # the children overlapped in time
    children = [t for t in _turns(client, root_id=job.root_id) if t.parent_call_id]
    assert len(children) == 4 and all(t.status == "completed" for t in children)
    top = [t for t in children if t.input_text in ("alpha", "beta", "gamma")]
    assert max(t.started_at for t in top) < min(t.finished_at for t in top)  # type: ignore[type-var]
    # and the root's one stream shows the whole tree, in order
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    names = [e.name for e in events]
    assert names.count(EventName.SUBAGENT_REQUESTED) == 4
    assert names.count(EventName.SUBAGENT_STARTED) == 4
    assert names.count(EventName.SUBAGENT_COMPLETED) == 4
    assert names.count(EventName.TURN_STARTED) == 5
    assert names.count(EventName.TURN_COMPLETED) == 5
    assert names[-1] is EventName.TURN_COMPLETED and events[-1].turn_id == job.id
    conversations = {e.conversation_id for e in events}
    assert len(conversations) == 5 and all(e.root_id == job.root_id for e in events)
    with client.runtime.session() as s:
        tree = sorted(
            (c.depth, c.kind)
            for c in s.exec(select(Conversation).where(Conversation.root_id == job.root_id))
        )
    assert tree == [(0, "main"), *[(1, "subagent")] * 3, (2, "subagent")]


def test_fanout_of_200_children_and_the_fanout_limit(client: Client, workers: Any) -> None:
    job = client.submit("fanout", "fan out")
    answer = job.result(timeout=180)
    calls = tool_calls(client, job.id)
    assert len(calls) == FANOUT
    done = [c for c in calls if not c.is_error]
    refused = [c for c in calls if c.is_error]
    assert len(done) == 200 and all(c.result == f"done t{c.position}" for c in done)
    assert len(refused) == 1 and "subagent limit reached (200" in refused[0].result
    # which of the parallel calls comes last to the limit is a race
    assert answer.count("done t") == 200 and "subagent limit reached" in answer
    assert len([t for t in _turns(client, root_id=job.root_id) if t.parent_call_id]) == 200


def test_depth_limit_becomes_an_error_result(client: Client, workers: Any) -> None:
    answer = client.submit("diver", "dive").result(timeout=60)
    assert answer.count("from below") == 4  # the root and three levels below it
    assert "subagent depth limit reached (3 levels below the root)" in answer


def test_messages_sent_while_a_turn_runs_run_next_in_order(client: Client, workers: Any) -> None:
    # Given a conversation in the middle of a turn
    job = client.submit("looper", "first")
    # When three messages are sent meanwhile
    entries = [client.send(job.conversation_id, text) for text in ("second", "third", "fourth")]
    assert client.job_for_message(job.conversation_id, entries[0]) is None  # still queued
    # Then each starts its own turn after the previous one, in order
    assert _job_for(client, job.conversation_id, entries[-1]).result(timeout=60) == "done: fourth"
    turns = _turns(client, conversation_id=job.conversation_id)
    assert [t.input_text for t in turns] == ["first", "second", "third", "fourth"]
    assert [t.number for t in turns] == [0, 1, 2, 3]
    assert all(t.status == "completed" for t in turns)
    for before, after in itertools.pairwise(turns):
        assert before.finished_at <= after.started_at  # type: ignore[operator]
    names = [e.name for e in job.events(deltas=False, timeout=5)]
    assert names.count(EventName.MESSAGE_QUEUED) == 3


def test_concurrent_sends_racing_the_end_of_turns_are_neither_lost_nor_doubled(
    client: Client, workers: Any
) -> None:
    job = client.submit("quick", "start")
    job.result(timeout=30)
    texts = [f"m{i}" for i in range(30)]
    gate = threading.Barrier(6)

    def sender(chunk: list[str]) -> None:
        gate.wait()
        for text in chunk:
            client.send(job.conversation_id, text)
            time.sleep(0.01)

    threads = [threading.Thread(target=sender, args=(texts[i::6],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 90
    while True:
        turns = _turns(client, conversation_id=job.conversation_id)
        if len(turns) >= 31 and all(t.status != "running" for t in turns):
            break
        assert time.monotonic() < deadline, f"{len(turns)} turns so far"
        time.sleep(0.3)
    time.sleep(1.0)
    turns = _turns(client, conversation_id=job.conversation_id)
    inputs = [t.input_text for t in turns[1:]]
    assert sorted(inputs) == sorted(texts)  # each message ran exactly once
    assert all(t.status == "completed" and t.output == f"ok: {t.input_text}" for t in turns[1:])


def test_cancel_stops_the_whole_tree_and_the_conversation_stays_usable(
    client: Client, workers: Any
) -> None:
    # Given a turn with a running tool and a running subagent (itself in a tool)
    job = client.submit("busy-lead", "work")
    deadline = time.monotonic() + 30
    while True:
        running = [t for t in _turns(client, root_id=job.root_id) if t.status == "running"]
        with client.runtime.session() as s:
            busy = s.exec(
                select(ToolCallRow).where(
                    col(ToolCallRow.turn_id).in_([t.id for t in running]),
                    ToolCallRow.status == "running",
                )
            ).all()
        if len(running) == 2 and len(busy) == 3:  # parent tool, subagent call, child tool
            break
        assert time.monotonic() < deadline, "the tree never got busy"
        time.sleep(0.1)

    # When the job is cancelled
    cancelled_at = time.monotonic()
    job.cancel()
    job.cancel()  # idempotent

    # Then within a few seconds every conversation of the tree is idle
    assert time.monotonic() - cancelled_at < 5
    with client.runtime.session() as s:
        states = s.exec(select(Conversation.state).where(Conversation.root_id == job.root_id)).all()
    assert sorted(states) == ["idle", "idle"]
    turns = _turns(client, root_id=job.root_id)
    assert [t.status for t in turns] == ["cancelled", "cancelled"]
    # (reading them to the end waits for the cluster's older transactions:
    # other tests' sessions on the shared Postgres can hold that back)
    events = list(job.events(deltas=False, timeout=30))
    names = [e.name for e in events]
    assert names.count(EventName.TURN_CANCELLED) == 2
    assert names.count(EventName.TOOL_CANCELLED) == 2
    assert names.count(EventName.SUBAGENT_STOPPED) == 1
    assert job.status().status is TurnStatus.CANCELLED

    # and nothing of the tree runs after the cancel settled
    # (seq is not contiguous and a late commit may sort before the last seq:
    # compare the rows themselves)
    with client.runtime.session() as s:
        settled = set(s.exec(select(EventRow.id).where(EventRow.root_id == job.root_id)).all())
    time.sleep(5.0)  # longer than the tools that were running
    with client.runtime.session() as s:
        stored = s.exec(select(EventRow).where(EventRow.root_id == job.root_id)).all()
        later = [r for r in stored if r.id not in settled]
        statuses = s.exec(
            select(ToolCallRow.status).where(col(ToolCallRow.turn_id).in_([t.id for t in turns]))
        ).all()
    assert later == []
    assert sorted(statuses) == ["cancelled"] * 3

    # and the conversation takes a new message on its history
    entry = client.send(job.conversation_id, "carry on")
    follow_up = _job_for(client, job.conversation_id, entry)
    # (the cancelled turn's orphaned calls are dropped from what the model
    # sees, so the scripted model starts its script again: a full new tree)
    answer = follow_up.result(timeout=30)
    assert '"label": "parent"' in answer and "child" in answer


def test_conversation_operations_refuse_while_a_turn_runs(client: Client, workers: Any) -> None:
    job = client.submit("looper", "hello")
    with pytest.raises(ConversationBusyError):
        client.fork(job.conversation_id)
    with pytest.raises(ConversationBusyError):
        client.clear(job.conversation_id)
    job.result(timeout=30)

    copy = client.fork(job.conversation_id)
    assert [m.text for m in client.history(copy)] == [
        m.text for m in client.history(job.conversation_id)
    ]
    loaded = [
        Message(role=Role.USER, content=[TextBlock(text="remember 42")]),
        Message(role=Role.ASSISTANT, content=[TextBlock(text="noted")]),
    ]
    assert client.load(copy, loaded) == 2
    assert client.history(copy) == loaded
    with pytest.raises(InvalidRequestError) as caught:
        client.load(copy, [{"role": "robot", "content": []}])
    assert "0.role" in caught.value.fields
    assert client.clear(copy) == 2
    assert client.history(copy) == []
    assert len(client.history(job.conversation_id)) == 4  # the original is untouched


def test_a_failing_child_gives_its_parent_an_error_result(client: Client, workers: Any) -> None:
    job = client.submit("careful-lead", "go")
    answer = job.result(timeout=60)
    assert "Error: subagent failed: model call failed" in answer and "3" in answer
    names = [e.name for e in job.events(deltas=False, timeout=5)]
    assert EventName.SUBAGENT_FAILED in names and EventName.TURN_FAILED in names
    assert names[-1] is EventName.TURN_COMPLETED


def test_a_forked_child_starts_with_the_parents_history(client: Client, workers: Any) -> None:
    answer = client.submit("forker", "my secret is 7").result(timeout=60)
    # the forked child's first user message is the parent's input; the fresh one's is its task
    assert "you said: my secret is 7" in answer and "you said: fresh" in answer


def test_a_dequeue_that_died_before_acknowledging_is_neither_lost_nor_doubled(
    client: Client, workers: Any
) -> None:
    # Given an idle conversation with two queued messages (nothing dispatched yet)
    rt = client.runtime
    job = client.submit("quick", "start")
    job.result(timeout=30)
    first, _ = inbox.send(rt, job.conversation_id, "one")
    second, _ = inbox.send(rt, job.conversation_id, "two")

    # When a dequeue starts the first message's turn and dies before deleting it
    request = JobRequest(
        agent="quick",
        input="one",
        conversation_id=job.conversation_id,
        idempotency_key=inbox.idempotency_key(job.conversation_id, first),
    )
    _ref, actions = engine.start_turn(rt, request, queued_entry=first)
    dispatch(client.celery, actions)

    # Then the fleet finishes that turn, skips the stale entry and runs the next once
    assert _job_for(client, job.conversation_id, second).result(timeout=30) == "ok: two"
    turns = _turns(client, conversation_id=job.conversation_id)
    assert [t.input_text for t in turns] == ["start", "one", "two"]
    assert rt.redis.xlen(f"{rt.settings.redis_prefix}:inbox:{job.conversation_id}") == 0
