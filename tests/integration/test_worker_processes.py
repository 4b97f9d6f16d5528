"""Workers use the machine: `chorus worker --processes N` runs N worker
processes that all take model steps, a killed one is restarted, a crash
loop ends the supervisor; the default tools pool runs a parallel batch of
I/O-bound tools at once, whatever the core count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator import Client, Settings
from schemas import EventName
from tests.conftest import ROOT, WorkerProcess, worker_env

pytestmark = pytest.mark.integration


def _own(settings: Settings) -> Settings:
    """SETTINGS with a Redis prefix of its own: the shared workers take none of its tasks."""
    return settings.model_copy(update={"redis_prefix": f"fleet-{uuid.uuid4().hex[:8]}"})


class Supervised:
    """`chorus worker --processes N` as a user starts it."""

    def __init__(self, settings: Settings, name: str, *args: str, env: dict[str, str]) -> None:
        self.node = f"{name}@{settings.redis_prefix}"
        self.log = Path(settings.state_dir) / f"{name}-{settings.redis_prefix}.log"
        command = [sys.executable, "-m", "orchestrator.cli", "worker", "-n", self.node, *args]
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def children(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        )
        return sorted(int(p) for p in out.stdout.split())

    def nodes(self, count: int) -> list[str]:
        base, host = self.node.split("@")
        return [f"{base}-{i}@{host}" for i in range(1, count + 1)]

    def wait_answering(self, client: Client, count: int, timeout: float = 90.0) -> None:
        """Until each of the COUNT process nodes answers a ping."""
        deadline = time.monotonic() + timeout
        nodes = self.nodes(count)
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            replies = client.celery.control.ping(destination=nodes, timeout=1.0)
            if {node for reply in replies for node in reply} == set(nodes):
                return
        raise AssertionError(f"{nodes} did not all answer:\n{self.log.read_text()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self.children():
            os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)


@contextmanager
def supervised(settings: Settings, name: str, *args: str) -> Iterator[Supervised]:
    worker = Supervised(settings, name, *args, env=worker_env(settings))
    try:
        yield worker
    finally:
        worker.kill()


def _step_workers(client: Client, jobs: list[str]) -> set[str]:
    """The `worker` (host:pid) of every llm.requested event of JOBS."""
    seen = set()
    for job_id in jobs:
        for event in client.job(job_id).events(deltas=False):
            if event.name is EventName.LLM_REQUESTED:
                seen.add(str(event.data["worker"]))
    return seen


def _pids(workers: set[str]) -> set[int]:
    return {int(w.rpartition(":")[2]) for w in workers}


@pytest.mark.long
@pytest.mark.timeout(300)
def test_processes_all_take_steps_and_a_killed_one_is_restarted(settings: Settings) -> None:
    # Given `chorus worker --processes 2` for llm,control and a tools worker
    # with the default pool
    own = _own(settings)
    client = Client(own)
    tools = WorkerProcess(own, "fleet-tools", "-Q", "tools")
    try:
        with supervised(own, "fleet-llm", "-Q", "llm,control", "--processes", "2") as llm:
            llm.wait_answering(client, 2)
            tools.wait_ready(client)
            first = llm.children()
            assert len(first) == 2
            # and the probe of the node it was given answers through its processes
            ping = [sys.executable, "-m", "orchestrator.cli", "ping", "--node", llm.node]
            probe = subprocess.Popen(
                ping,
                cwd=ROOT,
                env=worker_env(own),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            # (meanwhile, the tools worker's default pool runs a parallel batch at once)
            _a_parallel_batch_runs_at_once(client)
            _, err = probe.communicate(timeout=60)
            assert probe.returncode == 0, err

            # When jobs run on it
            jobs = [client.submit("fleet-batch", "1 0.05") for _ in range(12)]
            assert {job.result(timeout=120) for job in jobs} == {"slept 1"}

            # Then both processes made model calls
            assert _pids(_step_workers(client, [job.id for job in jobs])) == set(first)

            # When one process is killed
            os.kill(first[0], signal.SIGKILL)

            # Then the supervisor starts another under the same node name,
            # and jobs still complete
            deadline = time.monotonic() + 60
            while len(set(llm.children()) - {first[1]}) != 1 or first[0] in llm.children():
                assert time.monotonic() < deadline, llm.log.read_text()
                time.sleep(0.2)
            (replacement,) = set(llm.children()) - {first[1]}
            jobs = [client.submit("fleet-batch", "1 0.05") for _ in range(12)]
            llm.wait_answering(client, 2)
            assert {job.result(timeout=120) for job in jobs} == {"slept 1"}
            assert _pids(_step_workers(client, [job.id for job in jobs])) <= {
                first[1],
                replacement,
            }
            assert "killed by signal 9: restarting it" in llm.log.read_text()

            # When the supervisor gets SIGTERM (a container stop)
            children = llm.children()
            llm.proc.send_signal(signal.SIGTERM)

            # Then the children stop warm and it exits 0
            assert llm.proc.wait(60) == 0, llm.log.read_text()
            for pid in children:
                with pytest.raises(ProcessLookupError):
                    os.kill(pid, 0)
    finally:
        tools.stop()
        client.close()


@pytest.mark.long
@pytest.mark.timeout(240)
def test_a_crash_looping_process_ends_the_supervisor(settings: Settings) -> None:
    # Given workers whose modules cannot be imported
    own = _own(settings)
    env = worker_env(own, CHORUS_MODULES="tests.no_such_module")
    worker = Supervised(own, "fleet-broken", "-Q", "llm", "--processes", "2", env=env)
    try:
        # Then the supervisor gives up after a few restarts, with a failure status
        assert worker.proc.wait(200) != 0
        log = worker.log.read_text()
        assert "restarting it" in log and "stopping" in log
        assert worker.children() == []
    finally:
        worker.kill()


def test_an_unrecoverable_error_exits_non_zero(settings: Settings) -> None:
    # Given a worker whose consumer cannot start (Celery: "Unrecoverable error")
    env = worker_env(settings, CHORUS_MODULES="tests.unrecoverable")
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "worker", "-n", "unrecoverable@test"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # Then it exits with Celery's failure status, not 0 (a supervisor or a
    # restart policy would read 0 as a clean stop)
    assert "Unrecoverable error" in out.stdout + out.stderr
    assert out.returncode == 1, out.stderr[-2000:]


@pytest.mark.long
def test_processes_must_be_auto_or_a_positive_number(settings: Settings) -> None:
    for value, why in (("0", "positive"), ("many", "positive"), ("2 -P prefork", "prefork")):
        out = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "worker", "--processes", *value.split()],
            cwd=ROOT,
            env=worker_env(settings),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 2, out.stderr
        assert why in out.stderr


def _a_parallel_batch_runs_at_once(client: Client) -> None:
    """On a tools worker with the default pool, on a machine with fewer
    cores than the batch has tools, a parallel batch of I/O-bound tools
    waits together."""
    batch, seconds = 8, 3.0
    assert (os.cpu_count() or 1) < batch

    # When a step asks for 8 tools that each wait 3 s
    job = client.submit("fleet-batch", f"{batch} {seconds}")
    assert job.result(timeout=120) == f"slept {batch}"

    # Then they waited together: the batch took about one wait, not
    # batch / cores of them
    events = list(job.events(deltas=False))
    started = [e.time for e in events if e.name is EventName.TOOL_STARTED]
    completed = [e.time for e in events if e.name is EventName.TOOL_COMPLETED]
    assert len(started) == len(completed) == batch
    span = (max(completed) - min(started)).total_seconds()
    assert seconds <= span < 2 * seconds, span


def test_workers_collect_garbage_once_started(client: Client, workers: object) -> None:
    # Given the session's workers (`chorus worker`: collections are off while
    # one imports its modules and loads the model client)
    # When a job's model and tool report their processes' collector
    answer = json.loads(client.submit("collector-probe", "go").result(timeout=60))
    # Then both collect again, with the startup heap frozen out of it
    for process in ("model", "tools"):
        assert answer[process]["enabled"] is True, answer
        assert answer[process]["frozen"] > 100_000, answer


def test_a_tools_worker_whose_mcp_client_fails_to_load_still_collects_garbage(
    settings: Settings, tmp_path: Path
) -> None:
    # Given a tools worker whose MCP client cannot load (a broken install:
    # its `mcp_types` import fails), which logs that and goes on running
    # plain tools, beside a model worker
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "mcp_types.py").write_text("raise ImportError('a broken install')\n")
    own = _own(settings)
    client = Client(own)
    env = worker_env(own, PYTHONPATH=os.pathsep.join([str(broken), str(ROOT)]))
    tools = Supervised(own, "broken-tools", "-Q", "tools", "-P", "threads", env=env)
    model = WorkerProcess(own, "healthy-llm", "-Q", "llm,control")
    try:
        model.wait_ready(client)
        deadline = time.monotonic() + 60
        while not client.celery.control.ping(destination=[tools.node], timeout=0.5):
            assert tools.proc.poll() is None, tools.log.read_text()
            assert time.monotonic() < deadline, tools.log.read_text()
        # When a job's tool reports its process's collector
        answer = json.loads(client.submit("collector-probe", "go").result(timeout=60))
    finally:
        tools.kill()
        model.stop()
    # Then the failed loading did not leave collections off for good
    assert "a broken install" in tools.log.read_text()
    assert answer["tools"]["enabled"] is True, answer
