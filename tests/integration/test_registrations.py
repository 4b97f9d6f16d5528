"""What running workers register, as clients that import no worker module
see it: a name no running worker registers any more is refused at submit
within CHORUS_REGISTRATION_TTL (plus a client's 5 s cache), not accepted as
a job that then fails at its worker."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from orchestrator import Client, Settings, published, registry
from orchestrator.errors import UnknownAgentError
from orchestrator.runtime import Runtime
from orchestrator.store.migrate import upgrade
from tests.conftest import ROOT, WorkerProcess
from tests.faults import PrivateCluster

pytestmark = pytest.mark.integration

#: The module of an agent only the tests' own worker registers.
RETIRED = "tests.retired_agents"


@pytest.mark.long
def test_an_agent_whose_last_worker_stopped_is_refused_within_the_bound(
    settings: Settings, client: Client, workers: Any
) -> None:
    # Given a worker that registers one agent more than the rest of the fleet
    # (this process does not declare it: it knows it from what workers published)
    more = settings.model_copy(update={"modules": [*settings.modules, RETIRED]})
    worker = WorkerProcess(more, "retiring", "-Q", "retiring", "-P", "threads", "-c", "1")
    try:
        worker.wait_ready(client)
        assert "retired" not in registry.agent_names()
        client.submit("retired", "while it runs").cancel()  # accepted
    finally:
        worker.stop()
    stopped = time.monotonic()

    # When the rest of the fleet runs on without it, a submit naming it is
    # refused, by name, within the bound
    bound = settings.registration_ttl + published.FRESH_FOR + 5.0
    while True:
        try:
            client.submit("retired", "after it stopped").cancel()
        except UnknownAgentError as exc:
            refused, took = exc, time.monotonic() - stopped
            break
        assert time.monotonic() - stopped < bound, "still accepted past the bound"
        time.sleep(0.2)
    assert took < bound
    assert refused.name == "retired" and "'quick'" in str(refused)
    # and the fleet's own agents are submitted as before
    assert client.submit("quick", "still here").result(timeout=60) == "ok: still here"


_PUBLISH_RETIRED = f"""
import sys
from orchestrator import Settings, published, registry
from orchestrator.runtime import Runtime
registry.load_modules([{RETIRED!r}])
print(published.publish(Runtime(Settings(database_url=sys.argv[1]))))
"""


def test_on_sqlite_a_name_nobody_marks_expires_and_one_marked_stays(tmp_path: Path) -> None:
    # Given `chorus local`'s SQLite, where a worker published an agent and stopped
    url = f"sqlite:///{tmp_path / 'chorus.db'}"
    upgrade(url)
    started = subprocess.run(
        [sys.executable, "-c", _PUBLISH_RETIRED, url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.stdout.strip() == "1", started.stderr[-2000:]
    rt = Runtime(Settings(database_url=url, registration_ttl=1.0))
    published.learn(rt)
    assert registry.knows_agent("retired")

    # When this process (another worker, registering the tests' agents)
    # publishes and marks its own while the TTL passes
    registry.load_modules(["tests.agents"])
    assert published.publish(rt) > 0
    assert published.refresh(rt, 1.0) == 0  # marked just now: nothing to do
    time.sleep(1.2)
    assert published.refresh(rt, 1.0) > 0

    # Then the stopped worker's agent is unknown
    published.learn(rt)
    assert not registry.knows_agent("retired")


def test_workers_publishing_and_marking_at_once_never_deadlock(settings: Settings) -> None:
    # Given the registrations of the tests' modules, as every worker of the
    # fleet has them
    registry.load_modules(["tests.agents"])
    # (a pool of its own that keeps one connection once done: the session's
    # other tests share the server's max_connections)
    rt = Runtime(settings.model_copy(update={"db_pool_size": 1, "db_pool_overflow": 8}))
    failures: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(15):
                # a worker starting (its upsert) beside workers marking theirs
                # (every row due: marked over 5 s ago, as far as they know)
                if i % 2:
                    published.publish(rt)
                else:
                    published.refresh(rt, -10.0)
        except BaseException as exc:
            failures.append(exc)

    # When eight do so at once, over and over
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    # Then none lost a deadlock (or failed otherwise)
    assert failures == []


def test_marking_goes_on_after_postgres_restarts() -> None:
    # Given a worker's marking thread on a Postgres of this test alone
    with PrivateCluster() as pg:
        upgrade(pg.url)
        registry.load_modules(["tests.agents"])
        rt = Runtime(Settings(database_url=pg.url, registration_ttl=2.0))
        marking = published.Publisher(rt).start()
        try:
            # When Postgres restarts under it (its connections cut mid-marking)
            time.sleep(1.0)
            pg.restart()
            restarted = time.monotonic()
            # Then the thread lives on and marks every row again afterwards
            query = text(
                "SELECT count(*) FILTER (WHERE updated_at > now() - :age), count(*)"
                " FROM chorus_registration"
            )
            while True:
                with Runtime(Settings(database_url=pg.url)).session() as session:
                    age = timedelta(seconds=time.monotonic() - restarted)
                    fresh, rows = session.execute(query, {"age": age}).one()
                if fresh == rows > 0:
                    break
                assert time.monotonic() - restarted < 15, fresh
                time.sleep(0.2)
        finally:
            marking.stop()
