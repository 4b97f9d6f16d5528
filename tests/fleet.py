"""Fleets beyond the shared fixtures: beat (the sweeper), workers with their own settings."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator import Client, Settings
from tests.conftest import ROOT, WorkerProcess, worker_env


@contextmanager
def running_beat(settings: Settings, timeout: float = 60.0) -> Iterator[None]:
    """`chorus beat` (the periodic sweeper) for the fleet of ``settings``,
    once it has sent its first sweep (starting it takes seconds)."""
    log = Path(settings.state_dir) / f"beat-{uuid.uuid4().hex[:8]}.log"
    beat = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "beat", "-l", "INFO"],
        cwd=ROOT,
        env=worker_env(settings),
        start_new_session=True,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + timeout
        while "Sending due task" not in log.read_text(errors="replace"):
            if beat.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"beat did not start:\n{log.read_text(errors='replace')}")
            time.sleep(0.2)
        yield
    finally:
        beat.terminate()
        beat.wait(10)


@contextmanager
def llm_fleet(settings: Settings, name: str) -> Iterator[Client]:
    """A client and one llm+control worker (threads) under ``settings``, with beat.

    Give ``settings`` its own ``redis_prefix`` so the shared workers do not
    take its tasks.
    """
    client = Client(settings)
    worker = WorkerProcess(settings, name, "-Q", "llm,control", "-P", "threads", "-c", "4")
    try:
        worker.wait_ready(client)
        with running_beat(settings):
            yield client
    finally:
        worker.stop()
        client.close()
