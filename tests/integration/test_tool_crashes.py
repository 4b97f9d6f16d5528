"""Tools that kill their process: only sometimes, and inside a subagent
(issue 21, items 5 and 10), on the shared prefork tools worker."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Client
from tests.conftest import WorkerProcess, tool_calls
from tests.faults import isolated_settings
from tests.fleet import running_beat
from tests.services import Services

pytestmark = pytest.mark.integration


def test_a_tool_that_kills_its_process_twice_answers_on_its_third_run(
    client: Client, workers: Any, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    job = client.submit("sometimes-crasher", "go", context_data={"runs": str(runs)})
    answer = job.result(timeout=120)
    # three runs, each with the same key (the call's own id), and its answer
    keys = runs.read_text().split()
    (call,) = tool_calls(client, job.id)
    assert keys == [call.id] * 3
    assert json.loads(answer.removeprefix("results: ")) == ["ran 3 times"]
    assert not call.is_error and call.attempts == 3


def test_a_subagents_crashing_tool_ends_with_an_error_and_both_turns_go_on(
    client: Client, workers: Any, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    job = client.submit("crash-lead", "go", context_data={"runs": str(runs)})
    answer = job.result(timeout=180)
    results = json.loads(answer.removeprefix("results: "))
    assert "the tool's process died 3 times" in results[0], results
    assert results[1] == 2
    assert len(runs.read_text().split()) == 3


@pytest.mark.long
@pytest.mark.timeout(400)
def test_a_tool_that_kills_a_supervised_threads_worker_ends_with_an_error(
    services: Services, tmp_path: Path
) -> None:
    # Given a supervised threads worker (two processes) of the tool's queue,
    # an llm worker and beat (the sweeper re-sends the lost call: stall 1.5 s,
    # then 3 s and 6 s, each re-dispatch of the position waiting twice as
    # long; a re-sent copy waits in the queue while both processes restart)
    with isolated_settings(services, tmp_path, stall_timeout=1.5, sweep_interval=0.5) as settings:
        client = Client(settings)
        llm = WorkerProcess(settings, "llm", "-Q", "llm,control", "-P", "threads", "-c", "4")
        tools = WorkerProcess(
            settings, "crash", "-Q", "crash-threads", "-P", "threads", "-c", "4", "--processes", "2"
        )
        try:
            with running_beat(settings):  # beat starts while the workers do
                llm.wait_ready(client, 120)
                runs = tmp_path / "runs"
                job = client.submit("worker-crasher", "go", context_data={"runs": str(runs)})
                # Then the worker stays up while the sweeper re-sends the call,
                deadline = time.monotonic() + 240
                while not job.status().status.finished:
                    assert tools.proc.poll() is None, "the supervised worker stopped"
                    assert time.monotonic() < deadline
                    time.sleep(1)
                # and its 4th claim ends it with the error
                assert "the tool's process died 3 times" in job.result(timeout=1)
                assert len(runs.read_text().split()) == 3
        finally:
            llm.stop()
            tools.stop()
            client.close()
