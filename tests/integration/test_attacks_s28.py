"""Attacks on the session-28 changes, each kept once it worked (or a bound
that must hold): a transaction held open elsewhere and the event streams."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from orchestrator import AsyncClient, Client, ClientClosedError, Job, Settings
from orchestrator.server import follow
from schemas import Event, EventName
from tests.conftest import worker_env
from tests.test_cli import run

pytestmark = pytest.mark.integration

#: The streams' bound on waiting for older transactions, in these tests.
SETTLE = 1.5
#: A Redis URL nothing listens on.
NO_REDIS = "redis://127.0.0.1:1/0"


def _waiting_call(client: Client, job: Job) -> str:
    deadline = time.monotonic() + 30
    while not (found := client.pending_approvals(conversation_id=job.conversation_id)):
        assert time.monotonic() < deadline, "no call started waiting"
        time.sleep(0.05)
    return found[0].call_id


def _drain(events: Iterator[Event]) -> queue.Queue[list[Event] | BaseException]:
    """Every event ``events`` yields, read in a thread, put once it ends."""
    out: queue.Queue[list[Event] | BaseException] = queue.Queue()

    def run() -> None:
        try:
            out.put(list(events))
        except BaseException as exc:
            out.put(exc)

    threading.Thread(target=run, daemon=True).start()
    return out


@pytest.mark.parametrize("stream", ["tree", "job"])
def test_a_stream_ends_though_a_transaction_is_held_open_elsewhere(
    client: Client, workers: Any, monkeypatch: pytest.MonkeyPatch, stream: str
) -> None:
    """A turn ends while another session holds a write transaction open (a
    stopped process, a forgotten psql): its last events sort above what a
    read may return, so the server's stream waited for them forever, its
    follower thread and connection held. It ends within the bound now; a
    follower resuming after the last id it got reads the rest later."""
    monkeypatch.setattr(follow, "SETTLE_SECONDS", SETTLE)
    job = client.submit("travel-desk", "book it")
    call_id = _waiting_call(client, job)
    url = client.runtime.settings.database_url.replace("postgresql+psycopg", "postgresql")
    opened: dict[str, Callable[[], Iterator[Event]]] = {
        "tree": lambda: follow._tree(client, job.root_id, 0, False, threading.Event()),
        "job": lambda: job.events(since=0, deltas=False, settle_within=follow.SETTLE_SECONDS),
    }
    with psycopg.connect(url) as held:
        held.execute("SELECT pg_current_xact_id()")  # a transaction id, kept open
        drained = _drain(opened[stream]())  # following the running turn
        time.sleep(0.5)
        client.approve(call_id, by="tester")
        try:
            seen = drained.get(timeout=SETTLE * 2 + 15)
        except queue.Empty:
            pytest.fail("the stream did not end while a transaction was held open")
        assert not isinstance(seen, BaseException), seen
        assert job.status().status.finished
        held.rollback()
    # once the transaction ends, a follower resuming after its last id gets the rest
    last = max(e.seq or 0 for e in seen)
    rest = list(job.events(since=last, deltas=False, timeout=30))
    assert [e.name for e in rest][-1] == EventName.TURN_COMPLETED


def test_chorus_approve_while_redis_is_down_is_one_line_saying_the_answer_stands(
    client: Client, settings: Settings, workers: Any
) -> None:
    """The answer is stored before its call is sent: with the broker down
    the command printed kombu's whole traceback, and nothing said the
    approval was kept (giving it again is a 409)."""
    job = client.submit("travel-desk", "book it")
    call_id = _waiting_call(client, job)
    try:
        out = run(["approve", call_id], worker_env(settings, CHORUS_REDIS_URL=NO_REDIS))
        assert (out.returncode, out.stdout) == (1, ""), out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith(f"chorus: approved {call_id} (stored), but Redis does not")
        assert "Traceback" not in out.stderr
        assert client.pending_approvals(conversation_id=job.conversation_id) == []
    finally:
        client.cancel(job.id)


def test_closing_an_async_client_ends_a_result_awaited_on_it(
    settings: Settings, client: Client, workers: Any
) -> None:
    """close() returned at once, but a result() awaited on the client went
    on polling Postgres through the disposed engine (which opened a new
    pool) every 10 s for as long as the job ran: here, for good."""

    async def main() -> None:
        closing = AsyncClient(settings)
        job = await closing.submit("travel-desk", "book it")
        try:
            waiting = asyncio.create_task(job.result())
            await asyncio.sleep(1.0)  # the waiter waits for the turn's end
            await asyncio.wait_for(closing.close(), 10)
            with pytest.raises(ClientClosedError):
                await asyncio.wait_for(waiting, 5)
            with pytest.raises(ClientClosedError):
                await job.result(timeout=5)
        finally:
            client.cancel(job.id)

    asyncio.run(main())
