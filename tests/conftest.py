"""Shared fixtures: real services, a migrated database, worker processes, a client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import col, select

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from orchestrator import Client, Settings
from orchestrator.store.migrate import upgrade
from orchestrator.store.tables import MessageRow, ToolCallRow
from tests.parallel import (  # noqa: F401 (hooks: how the suite runs in parallel)
    pytest_collection_modifyitems,
    pytest_xdist_auto_num_workers,
    pytest_xdist_make_scheduler,
)
from tests.services import Services, provide_services

ROOT = Path(__file__).resolve().parent.parent
TEST_MODULES = "tests.agents"
#: The tests' inline specs call loopback model servers on any port.
LOOPBACK_ENDPOINTS = "http://127.0.0.1"
#: The workers' Groq key: of no known shape, so only redaction by value
#: keeps it out of events, rows, errors and logs.
PROVIDER_KEY = "Qv7Lw2Tz9Rb4Xm8Nc3Pd"


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    try:
        with provide_services() as found:
            upgrade(found.database_url)
            yield found
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


#: The fleet's CHORUS_REGISTRATION_TTL: an agent of a worker that stopped is
#: unknown to a client that does not declare it within seconds.
REGISTRATION_TTL = 4.0


@pytest.fixture(scope="session")
def settings(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        redis_url=services.redis_url,
        database_url=services.database_url,
        redis_prefix=services.redis_prefix,
        modules=[TEST_MODULES],
        state_dir=tmp_path_factory.mktemp("chorus-state"),
        stall_timeout=8.0,
        max_children=200,
        max_depth=3,
        sweep_interval=2.0,
        model_endpoints=[LOOPBACK_ENDPOINTS],
        registration_ttl=REGISTRATION_TTL,
    )


#: Postgres connections each worker process of the tests keeps idle (bursts
#: still open more): the parallel sessions of a run (tests/parallel.py), and
#: other runs on the same server, share its max_connections (100 by default).
WORKER_POOL_SIZE = "4"
#: And at most this many more under a burst (the default, 30, lets four
#: sessions' bursts pass the server's max_connections).
WORKER_POOL_OVERFLOW = "6"


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CHORUS_DB_POOL_SIZE", WORKER_POOL_SIZE)
    env.setdefault("CHORUS_DB_POOL_OVERFLOW", WORKER_POOL_OVERFLOW)
    env.update(
        CHORUS_REDIS_URL=settings.redis_url or "",
        CHORUS_DATABASE_URL=settings.db_url,
        CHORUS_REDIS_PREFIX=settings.redis_prefix,
        CHORUS_MODULES=",".join(settings.modules),
        CHORUS_STATE_DIR=str(settings.state_dir),
        CHORUS_STALL_TIMEOUT=str(settings.stall_timeout),
        CHORUS_SWEEP_INTERVAL=str(settings.sweep_interval),
        CHORUS_REGISTRATION_TTL=str(settings.registration_ttl),
        PYTHONPATH=str(ROOT),
        OPENAI_API_KEY="sk-test-not-a-secret",
        GROQ_API_KEY=PROVIDER_KEY,
        CHORUS_LOG_FORMAT="json",
        CHORUS_MAX_CHILDREN=str(settings.max_children),
        CHORUS_MAX_DEPTH=str(settings.max_depth),
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    env.update(extra)
    return env


#: The session's tools worker: a prefork pool (tests kill its processes).
TOOLS_WORKER = ("-Q", "tools", "-P", "prefork", "-c", "4")


class WorkerProcess:
    """A `chorus worker` subprocess, stopped at the end."""

    def __init__(self, settings: Settings, name: str, *args: str) -> None:
        self.name = f"{name}@{settings.redis_prefix}"
        log = Path(settings.state_dir) / f"{name}.log"
        self.log_path = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "worker",
                "-n",
                self.name,
                *args,
                "-l",
                "INFO",
            ],
            cwd=ROOT,
            env=worker_env(settings),
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, client: Client, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log_path.read_text()}")
            if client.celery.control.ping(destination=[self.name], timeout=0.5):
                return
        raise RuntimeError(f"worker {self.name} not ready:\n{self.log_path.read_text()}")

    def children(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        )
        return [int(p) for p in out.stdout.split()]

    def log_end(self) -> int:
        """Where the worker's log ends now."""
        return self.log_path.stat().st_size

    def deadlocks(self, since: int = 0) -> list[str]:
        """The lines logged after ``since`` (:meth:`log_end`) that report a
        deadlock lost."""
        with self.log_path.open("rb") as log:
            log.seek(since)
            lines = log.read().decode(errors="replace").splitlines()
        return [line for line in lines if "deadlock detected" in line]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def tool_calls(client: Client, turn_id: str) -> list[ToolCallRow]:
    """The turn's tool call rows, in the order the model made them, each with
    its result: once ``advance`` stored a step's results as its message, the
    message holds them and the rows do not (docs/architecture.md, Storage)."""
    with client.runtime.session() as s:
        calls = list(
            s.exec(
                select(ToolCallRow)
                .where(ToolCallRow.turn_id == turn_id)
                .order_by(col(ToolCallRow.step), col(ToolCallRow.position))
            ).all()
        )
        messages = s.exec(
            select(MessageRow).where(
                MessageRow.turn_id == turn_id, MessageRow.kind == "tool_results"
            )
        ).all()
        s.expunge_all()
    results = {
        (m.step, block["tool_request_id"]): block["result"] for m in messages for block in m.content
    }
    for c in calls:
        c.result = results.get((c.step, c.tool_request_id), c.result)
    return calls


@pytest.fixture(scope="session")
def client(settings: Settings) -> Iterator[Client]:
    c = Client(settings)
    yield c
    c.close()


def replace_tools_worker(
    settings: Settings, client: Client, workers: dict[str, WorkerProcess], name: str
) -> None:
    """Start a tools worker like the session's (``name``, after the old one
    was killed) in its place: later tests of the session rely on its pool of
    processes."""
    workers["tools"] = WorkerProcess(settings, name, *TOOLS_WORKER)
    workers["tools"].wait_ready(client, timeout=120)


@pytest.fixture(scope="session")
def workers(settings: Settings, client: Client) -> Iterator[dict[str, WorkerProcess]]:
    """One I/O worker (llm, control; threads) and one tools worker (prefork).
    At the end, neither may have lost a deadlock in the whole session: the
    one lock order (docs/architecture.md) rules them out."""
    procs = {
        "llm": WorkerProcess(settings, "llm", "-Q", "llm,control", "-P", "threads", "-c", "16"),
        "tools": WorkerProcess(settings, "tools", *TOOLS_WORKER),
    }
    try:
        for p in procs.values():
            p.wait_ready(client)
        yield procs
    finally:
        for p in procs.values():
            p.stop()
    deadlocks = [line for p in procs.values() for line in p.deadlocks()]
    assert deadlocks == [], "workers lost deadlocks this session:\n" + "\n".join(deadlocks[:5])
