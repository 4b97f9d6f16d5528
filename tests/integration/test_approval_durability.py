"""A call waiting for approval holds nothing but its row in Postgres: no
worker slot meanwhile, and its wait and its answer survive Redis (AOF, as
compose runs it) and the worker being SIGKILLed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator import AsyncClient, Client, ConflictError, Job, Settings
from schemas import TurnStatus
from tests.conftest import tool_calls
from tests.faults import Fleet, PrivateRedis, isolated_settings, running_fleet
from tests.integration.test_approvals import _completed, _runs, _waiting
from tests.services import Services

pytestmark = pytest.mark.integration

#: One worker process for every queue with one slot: a call holding it
#: would keep every other job of the fleet from running.
ONE_SLOT = {"all": ("-Q", "llm,control,tools", "-P", "threads", "-c", "1")}


@contextmanager
def one_slot_fleet(
    services: Services, tmp_path: Path, redis_url: str | None = None, beat: bool = False
) -> Iterator[tuple[Settings, Client, Fleet]]:
    """A fleet of its own (own database and Redis prefix, on ``redis_url``
    when given): the :data:`ONE_SLOT` worker, and beat (the sweeper)."""
    with (
        isolated_settings(services, tmp_path, redis_url=redis_url) as settings,
        running_fleet(settings, ONE_SLOT, beat=beat) as (client, fleet),
    ):
        yield settings, client, fleet


def _booking(client: Client, mark: Path) -> tuple[Job, str]:
    """A travel-desk job once its booking waits for approval and its other
    call (lookup_city) completed: nothing of it runs on a worker now."""
    job = client.submit("travel-desk", "book", context_data={"mark": str(mark)})
    waiting = _waiting(client, job)
    _completed(client, job)
    return job, waiting.call_id


def _booked_once(client: Client, job: Job, mark: Path) -> None:
    assert "booked LIS-123" in job.result(timeout=90)
    assert _runs(mark) == ["lookup_city Lisbon", "book_flight LIS-123"]
    [call] = [c for c in tool_calls(client, job.id) if c.tool == "book_flight"]
    assert (call.status, call.attempts) == ("completed", 1)


def test_a_waiting_call_holds_no_worker_slot(services: Services, tmp_path: Path) -> None:
    with one_slot_fleet(services, tmp_path) as (_, client, _fleet):
        # Given a call waiting for approval on a fleet of one worker slot
        mark = tmp_path / "mark"
        waiting, call_id = _booking(client, mark)

        # When a job needing no approval is submitted after it
        other = client.submit("fleet-batch", "1 0.1")

        # Then it completes while the first still waits
        assert other.result(timeout=60) == "slept 1"
        assert waiting.status().status is TurnStatus.RUNNING
        assert [
            p.call_id for p in client.pending_approvals(conversation_id=waiting.conversation_id)
        ] == [call_id]
        # and once approved, the first completes, its booking run once
        client.approve(call_id)
        _booked_once(client, waiting, mark)


async def _approve_async(settings: Settings, call_id: str, by: str) -> bool:
    async with AsyncClient(settings) as client:
        return await client.approve(call_id, by=by)


# chaos (-m slow); the default run keeps test_approvals.py's killed worker and
# test_attacks_s28.py's answer given while Redis is down
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_waiting_calls_survive_redis_and_their_worker_killed(
    services: Services, tmp_path: Path
) -> None:
    with (
        PrivateRedis(tmp_path / "redis") as redis_server,
        one_slot_fleet(services, tmp_path, redis_server.url, beat=True) as fleet_parts,
    ):
        settings, client, fleet = fleet_parts
        # Given three calls waiting for approval (their tasks ended)
        marks = [tmp_path / f"mark-{n}" for n in ("later", "during", "during-async")]
        bookings = [_booking(client, m) for m in marks]
        [later_call, during_call, async_call] = [call_id for _, call_id in bookings]

        # When Redis is SIGKILLed, and the worker too (restarted at once, as
        # compose restarts it: it waits for Redis)
        redis_server.kill()
        fleet.kill("all")
        # and two calls are approved while Redis is down (Client, AsyncClient):
        # each answer is stored in Postgres and approve returns False: not
        # sent now (the sweeper sends the call later); it stands
        assert client.approve(during_call, by="alice") is False
        assert asyncio.run(_approve_async(settings, async_call, "dave")) is False
        with pytest.raises(ConflictError, match="already approved by 'alice'"):
            client.approve(during_call, by="bob")
        # and Redis comes back, and the other call is approved then
        redis_server.start()
        fleet.wait_ready()
        assert client.approve(later_call, by="carol") is True

        # Then every job completes, each booking run once
        for (job, _), mark in zip(bookings, marks, strict=True):
            _booked_once(client, job, mark)
