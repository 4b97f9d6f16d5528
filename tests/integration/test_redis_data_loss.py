"""A Redis restart that loses its data (issue 21, item 13):
plain workers stay up, the calls in flight are not paid twice, jobs finish."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from orchestrator import Client
from tests.conftest import WorkerProcess
from tests.faults import PrivateRedis, isolated_settings
from tests.fleet import running_beat
from tests.integration.test_broker_faults import (
    _calls_in_flight,
    _calls_survived,
)
from tests.loopback_llm import LoopbackLLM
from tests.services import Services

pytestmark = pytest.mark.integration


@pytest.mark.long
@pytest.mark.timeout(300)
def test_workers_survive_redis_restarting_without_its_data(
    services: Services, tmp_path: Path
) -> None:
    # (A 40 s outage with AOF held too: run with the wipe off and a longer sleep.)
    outage, wipe = 2.0, True
    with (
        PrivateRedis(tmp_path / "redis") as server,
        isolated_settings(services, tmp_path, redis_url=server.url) as settings,
        LoopbackLLM() as llm,
    ):
        client = Client(settings)
        llm_worker = WorkerProcess(settings, "llm", "-Q", "llm,control", "-P", "threads", "-c", "4")
        tools_worker = WorkerProcess(settings, "tools", "-Q", "tools", "-P", "prefork", "-c", "2")
        try:
            with running_beat(settings):  # beat starts while the workers do
                llm_worker.wait_ready(client, 120)
                tools_worker.wait_ready(client, 120)
                # Given a model call in flight and a tool in flight
                thinking, sleeping = _calls_in_flight(client, llm, llm_worker, tools_worker)

                # When Redis is killed -9 and comes back (empty, or later)
                server.kill()
                if wipe:
                    shutil.rmtree(server.dir / "appendonlydir", ignore_errors=True)
                time.sleep(outage)
                server.start()

                # Then both jobs complete, each call made once, every worker up
                jobs, workers = (thinking, sleeping), (llm_worker, tools_worker)
                _calls_survived(client, llm, jobs, workers, 120)
                # and new jobs run
                assert client.submit("fleet-batch", "1 0.1").result(timeout=60) == "slept 1"
        finally:
            llm_worker.stop()
            tools_worker.stop()
            client.close()
    for w in (llm_worker, tools_worker):
        assert "Unrecoverable error" not in w.log_path.read_text(errors="replace")
