"""Followers of a job's event streams across a `chorus server` SIGKILLed
mid-stream and restarted, and a Redis (private) SIGKILLed and restarted,
with the job's call approved over HTTP while Redis is down: each follower,
reconnecting with ``Last-Event-ID`` whenever its stream ends or breaks,
gets every event of the job exactly once."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.faults import PrivateRedis
from tests.integration.test_approval_durability import _booked_once, _booking, one_slot_fleet
from tests.server.conftest import Server, bearer, free_port, make_token, sse, start_server
from tests.services import Services

pytestmark = pytest.mark.integration


class Resuming:
    """A follower that reconnects with ``Last-Event-ID`` until its stream
    ends without an error (the job or tree ended): every event it got."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.seqs: list[int] = []
        self.connects = 0
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.done.is_set():
            headers = bearer(self.token)
            if self.seqs:
                headers["Last-Event-ID"] = str(self.seqs[-1])
            try:
                with httpx.stream("GET", self.url, headers=headers, timeout=10) as answer:
                    if answer.status_code != 200:  # 503 while Redis or Postgres is away
                        time.sleep(0.3)
                        continue
                    self.connects += 1
                    failed = False
                    for frame in sse(answer.iter_lines()):
                        if "id" in frame:
                            self.seqs.append(int(frame["id"]))
                        failed = failed or frame.get("event") == "error"
                        if frame.get("event") == "end" and not failed:
                            self.done.set()
            except httpx.TransportError:
                time.sleep(0.3)


# chaos (-m slow); the default run keeps test_sse.py's reconnect and resume tests
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_followers_get_each_event_once_across_a_killed_server_and_redis(
    services: Services, tmp_path: Path
) -> None:
    with (
        PrivateRedis(tmp_path / "redis") as redis_server,
        one_slot_fleet(services, tmp_path, redis_server.url, beat=True) as (settings, client, _),
    ):
        # (an admin token: the job is submitted by the library, of no tenant)
        token = make_token(client, "ops", "admin", "followers")
        port = free_port()
        server: Server = start_server(settings, tmp_path / "server-1.log", port=port)
        try:
            # Given a job whose booking waits for a person, followed by its
            # job stream and its conversation's, twice each
            mark = tmp_path / "mark"
            job, call_id = _booking(client, mark)
            paths = [f"/v1/jobs/{job.id}/events", f"/v1/conversations/{job.conversation_id}/events"]
            followers = [Resuming(server.url + path, token) for path in paths * 2]
            deadline = time.monotonic() + 30
            while not all(f.seqs for f in followers):
                assert time.monotonic() < deadline, "a follower got no event"
                time.sleep(0.1)

            # When the server is SIGKILLed mid-stream and started again on its port
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)
            server = start_server(settings, tmp_path / "server-2.log", port=port)
            # and Redis is SIGKILLed, the call approved over HTTP meanwhile,
            # and Redis started again
            redis_server.kill()
            with httpx.Client(base_url=server.url, headers=bearer(token), timeout=30) as http:
                approved = http.post(f"/v1/approvals/{call_id}", json={"decision": "approve"})
            assert approved.status_code == 200, approved.text
            redis_server.start()

            # Then the job completes, its booking run once
            _booked_once(client, job, mark)
            # and every follower got each of the job's events exactly once
            with httpx.Client(base_url=server.url, headers=bearer(token), timeout=30) as http:
                page = http.get(f"/v1/runs/{job.id}/events", params={"limit": 5000}).json()
            stored = [e["seq"] for e in page["events"]]
            for follower in followers:
                assert follower.done.wait(60), "a follower never saw its stream end"
                assert follower.seqs == stored
                assert follower.connects >= 2  # it did reconnect
        finally:
            os.killpg(server.proc.pid, signal.SIGTERM)
            server.proc.wait(15)
