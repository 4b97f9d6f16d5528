"""Fleets beyond the shared fixtures: beat (the sweeper), workers with their own settings."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery._state import _set_task_join_will_block

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
        with running_beat(settings):  # beat starts while the worker does
            worker.wait_ready(client)
            yield client
    finally:
        worker.stop()
        client.close()


@contextmanager
def in_process_worker(settings: Settings, concurrency: int = 16) -> Iterator[Any]:
    """A Celery worker (threads pool, every queue) in a background thread."""
    from workers.app import create_app

    app = create_app(settings)
    # Celery resolves chord callbacks through the current app: without this,
    # an in-process worker runs chord parts but never their callback.
    app.set_current()
    app.set_default()
    worker = app.WorkController(
        pool_cls="threads",
        concurrency=concurrency,
        queues=["llm", "tools", "control"],
        hostname="chorus-local@localhost",
        loglevel=os.environ.get("CHORUS_LOCAL_LOGLEVEL", "WARNING"),
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    thread = threading.Thread(target=worker.start, name="chorus-local-worker", daemon=True)
    thread.start()
    try:
        yield app
    finally:
        worker.stop(in_sighandler=False)
        thread.join(10)
        # A started worker marks the whole process as one whose result.get()
        # would block a pool; this process is the test's client again.
        _set_task_join_will_block(False)
        # Chord results hold Redis subscriptions until collected; collect them
        # while the embedded Redis still runs, not at interpreter exit.
        gc.collect()


@contextmanager
def started(
    client: Client, workers: list[WorkerProcess], timeout: float = 120.0
) -> Iterator[list[WorkerProcess]]:
    """``workers`` (started together) once each answers a ping (within
    ``timeout`` s: a loaded machine takes long to import litellm); all
    stopped at the end."""
    try:
        for worker in workers:
            worker.wait_ready(client, timeout)
        yield workers
    finally:
        for worker in workers:
            worker.stop()
