"""AsyncClient against a real fleet: every operation, events without gaps,
many waiters on few connections."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from orchestrator import AsyncClient, Client, Settings
from orchestrator.errors import (
    ApprovalNotFound,
    ConflictError,
    ConversationNotFound,
    InvalidRequestError,
    JobFailedError,
    NoStructuredOutputError,
    ToolOutputNotFound,
    UnknownAgentError,
)
from orchestrator.store.tables import Conversation
from schemas import EventName, TurnStatus
from tests.conftest import worker_env

pytestmark = pytest.mark.integration

T = TypeVar("T")


def run(settings: Settings, body: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """``body`` on a fresh AsyncClient with a small pool, in its own loop."""

    async def main() -> T:
        small = settings.model_copy(update={"db_pool_size": 2, "db_pool_overflow": 3})
        async with AsyncClient(small) as client:
            return await body(client)

    return asyncio.run(main())


def test_submit_result_status_and_events_match_the_blocking_client(
    settings: Settings, client: Client, workers: Any
) -> None:
    async def body(ac: AsyncClient) -> tuple[str, Any, list[Any], list[Any], str]:
        job = await ac.submit("chatty", "hello")
        answer = await job.result(timeout=60)
        status = await job.status()
        events = [e async for e in job.events(deltas=False, timeout=30)]
        resumed = [e async for e in job.events(since=events[2].seq, deltas=False, timeout=30)]
        return answer, status, events, resumed, job.id

    answer, status, events, resumed, job_id = run(settings, body)

    blocking = client.job(job_id)
    assert answer == blocking.result(timeout=5)
    assert status == blocking.status() and status.status is TurnStatus.COMPLETED
    assert events == list(blocking.events(deltas=False, timeout=30))
    assert events[-1].name is EventName.TURN_COMPLETED
    assert resumed == events[3:]


def test_a_live_follower_sees_every_event_once_in_order(settings: Settings, workers: Any) -> None:
    async def body(ac: AsyncClient) -> tuple[list[Any], list[Any]]:
        job = await ac.submit("waited", "follow me")
        live = [e async for e in job.events(timeout=60)]  # from the start, while it runs
        stored = [e async for e in job.events(deltas=False, timeout=30)]
        return live, stored

    live, stored = run(settings, body)
    assert [e for e in live if e.seq is not None] == stored
    seqs = [e.seq for e in stored]
    assert seqs == sorted(set(seqs))
    assert live[-1].name is EventName.TURN_COMPLETED


def test_conversation_operations(settings: Settings, client: Client, workers: Any) -> None:
    async def body(ac: AsyncClient) -> dict[str, Any]:
        first = await ac.submit("quick", "one", tenant="acme")
        await first.result(timeout=60)
        conv = first.conversation_id
        entry = await ac.send(conv, "two")
        for _ in range(600):
            second = await ac.job_for_message(conv, entry)
            if second is not None:
                break
            await asyncio.sleep(0.1)
        assert second is not None
        out: dict[str, Any] = {"second": await second.result(timeout=60)}
        out["history"] = await ac.history(conv)
        out["usage"] = await ac.usage(conv)
        out["plan"] = await ac.plan(conv)
        out["same"] = (await ac.job(first.id)).conversation_id == conv
        fork = await ac.fork(conv, tenant="acme")
        out["forked"] = await ac.history(fork)
        out["cleared"] = await ac.clear(fork)
        out["loaded"] = await ac.load(fork, out["history"][:2])
        out["queue"] = await ac.clear_queue(conv)
        await ac.checkpoint(conv)
        with pytest.raises(ToolOutputNotFound):
            await ac.tool_output(conv, "no-such-handle")
        with pytest.raises(ConversationNotFound):
            await ac.usage("no-such-conversation")
        with pytest.raises(InvalidRequestError):
            await ac.job("x" * 65)
        with pytest.raises(InvalidRequestError):
            [e async for e in first.events(since=-1)]
        with pytest.raises(UnknownAgentError):
            await ac.submit("no-such-agent", "hi")
        with pytest.raises(InvalidRequestError) as caught:  # the conversation's is its root's
            await ac.submit("quick", "three", conversation_id=conv, tenant="globex")
        assert caught.value.fields == ["tenant"]
        out["ids"] = (conv, fork)
        return out

    out = run(settings, body)
    assert out["second"] == "ok: two"
    assert len(out["history"]) == 4 and out["forked"] == out["history"]
    assert out["usage"].input_tokens >= 0 and out["plan"] == [] and out["same"]
    assert out["cleared"] == 4 and out["loaded"] == 2 and out["queue"] == 0
    with client.runtime.session() as session:  # stored with each new conversation
        assert [session.get(Conversation, c).tenant for c in out["ids"]] == ["acme", "acme"]


def test_cancel_ends_a_waiting_result(settings: Settings, workers: Any) -> None:
    async def body(ac: AsyncClient) -> Any:
        job = await ac.submit("waited", "cancel me")  # its tool takes two seconds
        waiter = asyncio.ensure_future(job.result(timeout=60))
        await asyncio.sleep(0.5)
        await job.cancel()
        with pytest.raises(JobFailedError):
            await waiter
        return await job.status()

    assert run(settings, body).status is TurnStatus.CANCELLED


def test_approvals_answered_from_asyncio_once(settings: Settings, workers: Any) -> None:
    async def body(ac: AsyncClient) -> tuple[Any, list[Any], str, list[Any], list[Any]]:
        # Given a call waiting for approval (travel-desk's book_flight)
        job = await ac.submit("travel-desk", "book from asyncio")
        for _ in range(600):
            waiting = await ac.pending_approvals(conversation_id=job.conversation_id)
            if waiting:
                break
            await asyncio.sleep(0.05)
        [asked] = waiting
        mine = await ac.pending_approvals(tool="book_flight", agent="travel-desk")
        other = await ac.pending_approvals(conversation_id=job.conversation_id, tenant="nobody")
        with pytest.raises(InvalidRequestError):
            await ac.approve(asked.call_id, note="\ud800")  # Postgres cannot store it
        with pytest.raises(InvalidRequestError):
            await ac.deny(asked.call_id, reason=" ")
        with pytest.raises(ApprovalNotFound):
            await ac.approve("no-such-call")
        # When two people answer it at once on one event loop
        outcomes = await asyncio.gather(
            ac.approve(asked.call_id, note="ok", by="alice"),
            ac.deny(asked.call_id, reason="no", by="bob"),
            return_exceptions=True,
        )
        answer = await job.result(timeout=60)
        events = [e async for e in job.events(deltas=False, timeout=30)]
        return asked, outcomes, answer, events, [mine, other]

    asked, outcomes, answer, events, (mine, other) = run(settings, body)
    assert (asked.tool, asked.arguments) == ("book_flight", {"flight": "LIS-123"})
    assert asked.call_id in [p.call_id for p in mine] and other == []
    # Then exactly one answer stands, the other is a ConflictError, and the
    # turn went the winner's way
    # (the winner's answer sent at once: True)
    assert sorted(repr(o) if o is True else type(o).__name__ for o in outcomes) == [
        "ConflictError",
        "True",
    ]
    answered = [e for e in events if e.name in (EventName.TOOL_APPROVED, EventName.TOOL_DENIED)]
    assert len(answered) == 1
    if answered[0].name is EventName.TOOL_APPROVED:
        assert (answered[0].data["by"], outcomes[0]) == ("alice", True)
        assert "booked LIS-123" in answer
    else:
        assert (answered[0].data["by"], outcomes[1]) == ("bob", True)
        assert "was not run: denied: no" in answer
    assert isinstance(next(o for o in outcomes if o is not True), ConflictError)


def test_a_thousand_awaits_share_a_few_connections(settings: Settings, workers: Any) -> None:
    async def body(ac: AsyncClient) -> tuple[list[str], dict[str, int]]:
        jobs = [await ac.submit("waited", f"job {i}") for i in range(10)]
        waits = [asyncio.ensure_future(jobs[n % 10].result(timeout=120)) for n in range(1000)]
        await asyncio.sleep(1.0)  # every waiter subscribed and waiting
        held = await ac.connections()
        return await asyncio.gather(*waits), held

    answers, held = run(settings, body)
    assert len(answers) == 1000 and all(a.startswith("waited for") for a in answers)
    assert held["postgres"] <= 5 and held["redis"] <= 6, held


def test_typed_output_in_both_clients(settings: Settings, client: Client, workers: Any) -> None:
    from tests.agents import Trip

    async def body(ac: AsyncClient) -> tuple[Any, Any, str]:
        job = await ac.submit("extractor", "plan a trip")
        typed = await job.output(timeout=60)
        quick = await ac.submit("quick", "no structure")
        with pytest.raises(NoStructuredOutputError):
            await quick.output(timeout=60)
        return typed, await job.output(Trip), job.id

    typed, again, job_id = run(settings, body)
    assert typed == Trip(city="Lisbon", nights=3) and isinstance(typed, Trip)
    assert again == typed
    blocking = client.job(job_id)
    assert blocking.output(timeout=5) == typed
    with pytest.raises(InvalidRequestError):
        blocking.output(Unrelated)  # the answer is not one


class Unrelated(BaseModel):
    name: str


#: A process that imports no agent or tool module: it validates agent names
#: against what the workers published.
BARE = """
import asyncio, json, sys
from orchestrator import AsyncClient, Client, UnknownAgentError

client = Client()
sync_answer = client.submit("quick", "bare sync").result(timeout=60)
sync_output = client.submit("extractor", "a trip").output(timeout=60)
try:
    client.submit("no-such-agent", "hi")
except UnknownAgentError as exc:
    unknown = str(exc)

async def main():
    async with AsyncClient() as ac:
        job = await ac.submit("quick", "bare async")
        return await job.result(timeout=60)

print(json.dumps({
    "sync": sync_answer,
    "async": asyncio.run(main()),
    "output": sync_output,
    "unknown": unknown,
    "imported": sorted(m for m in sys.modules if m.startswith("tests")),
}))
"""


def test_a_client_importing_no_agent_module_submits_by_name(
    settings: Settings, workers: Any
) -> None:
    env = worker_env(settings, CHORUS_MODULES="")
    out = subprocess.run(
        [sys.executable, "-c", BARE], env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["sync"] == "ok: bare sync" and found["async"] == "ok: bare async"
    assert found["output"] == {"city": "Lisbon", "nights": 3}  # no Trip class here: its JSON
    assert "no-such-agent" in found["unknown"] and "'quick'" in found["unknown"]
    assert found["imported"] == []
