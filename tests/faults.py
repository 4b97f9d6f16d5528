"""Fault injection helpers: a supervised fleet, private Redis and Postgres
servers to kill, and the bookkeeping of a run (time, re-executions,
duplicates, lost work).

The shared test services are never stopped: a test that restarts Redis or
Postgres starts its own on a free port.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import redis
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import col, select

from orchestrator import Client, Settings
from orchestrator.keys import inbox
from orchestrator.store.migrate import upgrade
from orchestrator.store.tables import Conversation, EventRow, ToolCallRow, Turn
from schemas import EventName, TurnStatus
from tests.agents import CHAOS_CALLS_FILE
from tests.conftest import LOOPBACK_ENDPOINTS, ROOT, TEST_MODULES, WorkerProcess, worker_env
from tests.services import Services, _drop_prefix, _own_database

PollErrors = (SQLAlchemyError, psycopg.Error, redis.RedisError, OSError)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def push_onto_queues(settings: Settings, messages: Sequence[bytes]) -> redis.Redis:
    """Push raw ``messages`` onto the fleet's control, llm and tools queues in
    turn, as a broken or hostile producer would; the broker's client."""
    broker = redis.Redis.from_url(settings.redis_url or "")
    for i, raw in enumerate(messages):
        broker.lpush(f"{settings.redis_prefix}:{('control', 'llm', 'tools')[i % 3]}", raw)
    return broker


@contextmanager
def isolated_settings(
    services: Services,
    state_dir: Path,
    *,
    redis_url: str | None = None,
    database_url: str | None = None,
    **overrides: object,
) -> Iterator[Settings]:
    """Settings with their own Redis prefix and (unless given) their own
    migrated database on the shared server: no other test's worker or
    sweeper sees this run's tasks or rows."""
    prefix = f"chorus-fault-{uuid.uuid4().hex[:8]}"
    redis_url = redis_url or services.redis_url
    with _database(services, database_url) as db_url:
        try:
            yield Settings(
                redis_url=redis_url,
                database_url=db_url,
                redis_prefix=prefix,
                modules=[TEST_MODULES],
                model_endpoints=[LOOPBACK_ENDPOINTS],
                state_dir=state_dir,
                **{"stall_timeout": 8.0, "sweep_interval": 2.0, **overrides},  # type: ignore[arg-type]
            )
        finally:
            if redis_url == services.redis_url:
                _drop_prefix(redis_url, prefix)


@contextmanager
def _database(services: Services, database_url: str | None) -> Iterator[str]:
    if database_url is not None:
        upgrade(database_url)
        yield database_url
        return
    server = make_url(services.database_url).set(database="postgres")
    with _own_database(server.render_as_string(hide_password=False)) as url:
        upgrade(url)
        yield url


class Fleet:
    """`chorus worker` processes and `chorus beat`, each restarted when it
    dies, as compose's `restart: unless-stopped` does."""

    def __init__(
        self,
        settings: Settings,
        client: Client,
        workers: Mapping[str, Sequence[str]],
        beat: bool = True,
    ) -> None:
        self.settings = settings
        self.client = client
        self.specs = dict(workers)
        self.procs: dict[str, WorkerProcess] = {}
        self.starts: Counter[str] = Counter()
        self.kills = 0
        self._lock = threading.Lock()
        self._beat: subprocess.Popen[bytes] | None = None
        for role in self.specs:
            self._start(role)
        if beat:
            self._start_beat()

    def _start(self, role: str) -> None:
        self.starts[role] += 1
        name = f"{role}-{self.starts[role]}"
        self.procs[role] = WorkerProcess(self.settings, name, *self.specs[role])

    def _start_beat(self) -> None:
        self.starts["beat"] += 1
        log = Path(self.settings.state_dir) / f"beat-{self.starts['beat']}.log"
        self._beat = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "beat", "-l", "INFO"],
            cwd=ROOT,
            env=worker_env(self.settings),
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        for proc in self.procs.values():
            proc.wait_ready(self.client, timeout)

    def kill(self, role: str) -> None:
        """SIGKILL the worker's whole process group (main process and pool), restart it."""
        with self._lock:
            proc = self.procs[role].proc
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            self.kills += 1
            self._start(role)

    def kill_loop(self, kills: int, interval: float, rng: random.Random) -> None:
        """Kill a random worker every ``interval`` seconds, ``kills`` times;
        each worker is killed as often as the others, in a random order."""
        roles: list[str] = []
        for _ in range(kills):
            if not roles:
                roles = sorted(self.procs)
                rng.shuffle(roles)
            time.sleep(interval)
            self.kill(roles.pop())

    def supervise(self) -> None:
        """Restart whatever exited (a worker or beat that lost its broker, say)."""
        with self._lock:
            for role, proc in self.procs.items():
                if proc.proc.poll() is not None:
                    self._start(role)
            if self._beat is not None and self._beat.poll() is not None:
                self._start_beat()

    @property
    def restarts(self) -> int:
        """Starts beyond the first of each process, kills excluded."""
        return sum(n - 1 for n in self.starts.values()) - self.kills

    def stop(self) -> None:
        with self._lock:
            for proc in self.procs.values():
                proc.stop()
            if self._beat is not None and self._beat.poll() is None:
                self._beat.terminate()
                try:
                    self._beat.wait(10)
                except subprocess.TimeoutExpired:
                    self._beat.kill()
                    self._beat.wait(5)


@contextmanager
def running_fleet(
    settings: Settings, workers: Mapping[str, Sequence[str]], beat: bool = True
) -> Iterator[tuple[Client, Fleet]]:
    client = Client(settings)
    fleet = Fleet(settings, client, workers, beat)
    try:
        fleet.wait_ready()
        yield client, fleet
    finally:
        fleet.stop()
        client.close()


#: One worker process for every queue: the cheapest fleet for a single job.
ONE_WORKER = {"all": ("-Q", "llm,control,tools", "-P", "threads", "-c", "12")}


def wait_turns(
    client: Client,
    conversation_ids: Sequence[str],
    expected: int,
    timeout: float,
    fleet: Fleet | None = None,
) -> None:
    """Wait until the conversations hold ``expected`` turns, none running.
    Tolerates the database or Redis being down meanwhile."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while True:
        try:
            with client.runtime.session() as s:
                seen = list(
                    s.exec(
                        select(Turn.status).where(col(Turn.conversation_id).in_(conversation_ids))
                    ).all()
                )
        except PollErrors:
            pass  # the database is restarting
        if len(seen) >= expected and TurnStatus.RUNNING.value not in seen:
            return
        if fleet is not None:
            fleet.supervise()
        if time.monotonic() > deadline:
            raise AssertionError(
                f"after {timeout:.0f}s: {len(seen)} of {expected} turns exist, "
                f"statuses {dict(Counter(seen))}\n{_stuck(client, conversation_ids)}"
            )
        time.sleep(0.5)


def _stuck(client: Client, conversation_ids: Sequence[str]) -> str:
    """Where each unfinished conversation stands, and its queued messages."""
    lines = []
    with client.runtime.session() as s:
        convs = s.exec(select(Conversation).where(col(Conversation.id).in_(conversation_ids)))
        for c in convs:
            queued = client.runtime.redis.xlen(inbox(client.settings.redis_prefix, c.id))
            if c.state == "idle" and not queued:
                continue
            calls = s.exec(
                select(ToolCallRow.step, ToolCallRow.segment, ToolCallRow.status).where(
                    ToolCallRow.turn_id == c.turn_id
                )
            ).all()
            lines.append(
                f"  conversation {c.id} {c.state} turn {c.turn_id} cursor "
                f"{c.cursor_step}/{c.cursor_segment} lease {c.lease_until} progress "
                f"{c.progress_at} queued {queued}; calls {sorted(calls)}"
            )
    return "\n".join(lines)


def wait_for_running_tools(client: Client, conversation_ids: Sequence[str], timeout: float) -> None:
    """Wait until some tool call of the conversations is running (mid-run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with client.runtime.session() as s:
            running = s.exec(
                select(ToolCallRow.id).where(
                    col(ToolCallRow.conversation_id).in_(conversation_ids),
                    ToolCallRow.status == "running",
                )
            ).first()
        if running is not None:
            return
        time.sleep(0.1)
    raise AssertionError("no tool call started")


# -- bookkeeping --------------------------------------------------------------


@dataclass
class Figures:
    """What a run cost and whether it kept its promises."""

    label: str
    seconds: float = 0.0
    turns: int = 0
    kills: int = 0
    restarts: int = 0
    tool_calls: int = 0
    tools_rerun: int = 0  # tool calls executed more than once (attempts > 1)
    #: calls whose process died CHORUS_MAX_TOOL_ATTEMPTS times: their one
    #: result is the error "the tool's process died N times" (not lost)
    tools_given_up: int = 0
    model_steps: int = 0
    steps_recalled: int = 0  # steps whose model was called more than once
    extra_model_calls: int = 0
    unacked: int | None = None  # messages left unacknowledged in Redis at the end
    duplicates: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"[faults] {self.label}: {self.turns} turns in {self.seconds:.1f}s; "
            f"kills {self.kills}, other restarts {self.restarts}; "
            f"re-executions: tool calls {self.tools_rerun}/{self.tool_calls} "
            f"({self.tools_given_up} given up), "
            f"model steps {self.steps_recalled}/{self.model_steps} "
            f"(+{self.extra_model_calls} calls); unacked left {self.unacked}; "
            f"duplicates {len(self.duplicates)}; lost {len(self.lost)}"
        )

    def report(self) -> None:
        print("\n" + self.line())
        for what in self.duplicates[:10]:
            print(f"[faults]   duplicate: {what}")
        for what in self.lost[:10]:
            print(f"[faults]   lost: {what}")


#: (input text of a turn, what its answer must be)
Expected = list[tuple[str, str]]


def chaos_expected(inputs: Sequence[str]) -> Expected:
    return [(text, f"done: {text}") for text in inputs]


def account(
    client: Client,
    figures: Figures,
    conversation_ids: Sequence[str],
    expected: Expected,
    tools_per_turn: int,
) -> Figures:
    """Check every turn, tool call and result of the run; fill in ``figures``."""
    with client.runtime.session() as s:
        turns = list(s.exec(select(Turn).where(col(Turn.conversation_id).in_(conversation_ids))))
        ids = [t.id for t in turns]
        calls = list(s.exec(select(ToolCallRow).where(col(ToolCallRow.turn_id).in_(ids))))
        events = list(
            s.exec(
                select(EventRow.name, EventRow.turn_id, EventRow.data).where(
                    col(EventRow.turn_id).in_(ids),
                    col(EventRow.name).in_(
                        [
                            EventName.TOOL_COMPLETED.value,
                            EventName.TOOL_FAILED.value,
                            EventName.TURN_COMPLETED.value,
                            EventName.TURN_FAILED.value,
                            EventName.TURN_CANCELLED.value,
                        ]
                    ),
                )
            )
        )
    figures.turns = len(turns)
    _account_turns(figures, turns, expected, events)
    _account_calls(figures, turns, calls, events, tools_per_turn)
    return figures


def _account_turns(
    figures: Figures, turns: list[Turn], expected: Expected, events: list[tuple[str, str, dict]]
) -> None:
    by_input: dict[str, list[Turn]] = {}
    for t in turns:
        by_input.setdefault(t.input_text, []).append(t)
    for text, answer in expected:
        found = by_input.get(text, [])
        if len(found) > 1:
            figures.duplicates.append(f"{len(found)} turns for input {text!r}")
        if not found:
            figures.lost.append(f"no turn for input {text!r}")
        elif found[0].status != TurnStatus.COMPLETED.value or found[0].output != answer:
            figures.lost.append(
                f"turn {found[0].id} for {text!r}: {found[0].status}, "
                f"output {found[0].output!r}, error {found[0].error!r}"
            )
    ends = Counter(turn_id for name, turn_id, _ in events if name.startswith("turn."))
    for turn_id, n in ends.items():
        if n > 1:
            figures.duplicates.append(f"{n} terminal events for turn {turn_id}")


def _account_calls(
    figures: Figures,
    turns: list[Turn],
    calls: list[ToolCallRow],
    events: list[tuple[str, str, dict]],
    tools_per_turn: int,
) -> None:
    figures.tool_calls = len(calls)
    figures.tools_rerun = sum(1 for c in calls if c.attempts > 1)
    per_turn = Counter(c.turn_id for c in calls)
    for t in turns:
        if per_turn[t.id] != tools_per_turn:
            where = figures.duplicates if per_turn[t.id] > tools_per_turn else figures.lost
            where.append(f"turn {t.id} has {per_turn[t.id]} tool calls, not {tools_per_turn}")
    results = Counter(
        (turn_id, data.get("tool_request_id"))
        for name, turn_id, data in events
        if name.startswith("tool.")
    )
    attempts = Settings().max_tool_attempts  # the fleet's: from the same environment
    for c in calls:
        n = results[(c.turn_id, c.tool_request_id)]
        if n > 1:
            figures.duplicates.append(f"{n} result events for tool call {c.id} ({c.tool})")
        if n == 1 and c.status == "failed" and c.attempts > attempts:
            figures.tools_given_up += 1  # killed that often: its result is the error
        elif n == 0 or c.status != "completed":
            figures.lost.append(f"tool call {c.id} ({c.tool}): {c.status}, {n} result events")


def count_model_calls(figures: Figures, settings: Settings, tag: str) -> None:
    """Model calls per step of the "chaos" script, as the model saw them."""
    path = Path(settings.state_dir) / CHAOS_CALLS_FILE
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    per_step = Counter(line for line in lines if line.startswith(f"{tag}-"))
    figures.model_steps = len(per_step)
    figures.steps_recalled = sum(1 for n in per_step.values() if n > 1)
    figures.extra_model_calls = sum(n - 1 for n in per_step.values())


def unacked(settings: Settings) -> int | None:
    """Task messages delivered but never acknowledged (redelivered after the
    visibility timeout)."""
    try:
        r = redis.Redis.from_url(settings.redis_url or "")
        return int(r.hlen(f"{settings.redis_prefix}:unacked"))
    except redis.RedisError:
        return None


# -- private services ----------------------------------------------------------


def need(binary: str) -> str:
    found = shutil.which(binary)
    if found is None:
        pytest.skip(f"{binary} is not installed here (needed to restart a private server)")
    return found


class PrivateRedis:
    """A redis-server of this test alone, with AOF as compose runs it."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.dir = data_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                need("redis-server"),
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--appendonly", "yes",
                "--appendfsync", "everysec",
                "--save", "",
                "--dir", str(self.dir),
            ],
            stdout=(self.dir / "redis.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def kill(self) -> None:
        """kill -9: whatever AOF had not written (up to a second) is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> PrivateRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


class PrivateCluster:
    """A Postgres cluster of this test alone (pg_createcluster), trust auth."""

    def __init__(self) -> None:
        need("pg_createcluster")
        self.version = sorted(os.listdir("/etc/postgresql"))[-1]
        self.name = f"chorus_fault_{os.getpid()}"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(["pg_ctlcluster", self.version, self.name, *args], check=True)

    def __enter__(self) -> PrivateCluster:
        self._drop()  # a leftover of an earlier run that died
        subprocess.run(
            ["pg_createcluster", self.version, self.name, "-p", str(self.port),
             "--", "--auth=trust"],
            check=True,
            capture_output=True,
        )  # fmt: skip
        self._ctl("start")
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while subprocess.run(
            ["pg_isready", "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True
        ).returncode:
            assert time.monotonic() < deadline, "private Postgres did not start"
            time.sleep(0.2)

    def restart(self) -> None:
        self._ctl("restart")
        self._wait_ready()

    def stop(self) -> None:
        self._ctl("stop")

    def start(self) -> None:
        self._ctl("start")
        self._wait_ready()

    def _drop(self) -> None:
        subprocess.run(
            ["pg_dropcluster", "--stop", self.version, self.name], capture_output=True, check=False
        )

    def __exit__(self, *exc: object) -> None:
        self._drop()
