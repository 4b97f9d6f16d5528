"""Fleets beyond the shared fixtures: beat (the sweeper), workers with their own settings."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator import Client, Settings
from tests.conftest import ROOT, WorkerProcess, worker_env


@contextmanager
def running_beat(settings: Settings) -> Iterator[None]:
    """`chorus beat` (the periodic sweeper) for the fleet of ``settings``."""
    beat = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "beat", "-l", "WARNING"],
        cwd=ROOT,
        env=worker_env(settings),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
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
