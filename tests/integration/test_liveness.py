"""A worker's liveness needs no Redis (issue 21, item 20).

`chorus alive` (the chart's and compose's liveness probe) passes for a
worker through a Redis outage, because each process touches its own file
in CHORUS_STATE_DIR from a thread of its own (`chorus ping`, through
Redis, is the readiness probe). Beat's file shows that it sends sweeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import Client, Settings
from orchestrator.liveness import beats_dir
from tests.conftest import ROOT, WorkerProcess, worker_env
from tests.faults import PrivateRedis
from tests.fleet import running_beat

pytestmark = pytest.mark.integration


def _chorus(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI's outcome; a command still running after a minute counts as failed."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args],
            cwd=ROOT,
            env=worker_env(settings),
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as cut:
        return subprocess.CompletedProcess(cut.cmd, -1, "", "timed out")


@pytest.mark.long
def test_a_redis_outage_does_not_fail_a_workers_liveness(
    settings: Settings, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    with PrivateRedis(tmp_path / "redis") as private:
        mine = settings.model_copy(
            update={
                "redis_url": private.url,
                "redis_prefix": f"alive-{uuid.uuid4().hex[:6]}",
                "state_dir": state,
            }
        )
        client = Client(mine)
        worker = WorkerProcess(mine, "probe", "-Q", "control", "-P", "threads", "-c", "2")
        try:
            with running_beat(mine):
                worker.wait_ready(client)
                client.close()
                # beat shows each sweep it sends (every sweep_interval seconds)
                sent = (beats_dir(state) / "beat").stat().st_mtime
                _wait_for(lambda: (beats_dir(state) / "beat").stat().st_mtime > sent)
            assert _chorus(mine, "alive", "--node", worker.name).returncode == 0

            # When Redis goes away
            private.kill()
            gone = time.time()

            # Then the worker still shows it runs: its file is touched, the probe passes
            mark = beats_dir(state) / worker.name
            _wait_for(lambda: mark.stat().st_mtime > gone)
            probe = _chorus(mine, "alive", "--node", worker.name, "--max-age", "30")
            assert probe.returncode == 0, probe.stderr
            assert worker.proc.poll() is None
        finally:
            if worker.proc.poll() is None:  # no warm shutdown to wait for without Redis
                os.killpg(worker.proc.pid, signal.SIGKILL)
                worker.proc.wait(10)


def _wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "no sign of life"
        time.sleep(0.5)
