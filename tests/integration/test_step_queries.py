"""What one agent step costs Postgres, counted from the engine's own statements.

A Celery worker with a threads pool runs in this process (as ``chorus
local`` does, on its own Redis prefix so no other worker takes its tasks),
sharing this process's engine; listeners on that engine count, per task,
the statements it executes, the transactions that ran at least one, and
the round trips these cost: one per statement, one for the ``BEGIN``
psycopg sends before a transaction's first statement, one for its
``COMMIT`` or ``ROLLBACK``, and one per ping of a connection that sat idle
in the pool. A statement run in autocommit mode is its own transaction
without ``BEGIN``/``COMMIT``: it counts as one round trip, and a write
among them as a commit (``commits`` = transactions + such writes).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery.signals import task_postrun, task_prerun
from sqlalchemy import event
from sqlalchemy.engine import Connection

from orchestrator import Client, Settings
from orchestrator.store.db import PING_AFTER_IDLE, get_engine
from tests.agents import SMALL_FANOUT
from tests.fleet import in_process_worker

pytestmark = pytest.mark.integration

#: Tool steps of the measured turn (the agent then answers in one more step).
STEPS = 6
#: The issue's targets per 4-tool step (chorus.step, 4 x chorus.tool,
#: chorus.advance), printed beside the figures.
TARGET_TRANSACTIONS = 5
TARGET_ROUND_TRIPS = 30
#: Commits (WAL flushes): each of a step's six tasks commits what it did,
#: the step its lease before the model call, its ``llm.requested`` as the
#: call is sent (a follower sees the call start before its text) and its
#: reply after, each tool its claim before running and its result after
#: (single autocommit statements, the result with its events in one), the
#: advance the cursor.
MAX_COMMITS = 12
#: Round trips per child of a fan-out (its start, its step, its answer and
#: its share of the parent's steps and advances): 16 when this was written.
MAX_ROUND_TRIPS_PER_CHILD = 20


@dataclass
class Cost:
    """What one task cost Postgres."""

    task: str
    args: tuple[Any, ...]
    statements: int = 0
    transactions: int = 0
    commits: int = 0  # transactions, and writes committed on their own (autocommit)
    round_trips: int = 0

    def add(self, other: Cost) -> None:
        self.statements += other.statements
        self.transactions += other.transactions
        self.commits += other.commits
        self.round_trips += other.round_trips


@dataclass
class Meter:
    """Counts the statements of the task running in each worker thread."""

    costs: list[Cost] = field(default_factory=list)
    local: threading.local = field(default_factory=threading.local)
    open: dict[int, bool] = field(default_factory=dict)  # connection -> statements since BEGIN
    step: Cost | None = None  # the chorus.step that began last

    def current(self) -> Cost | None:
        cost: Cost | None = getattr(self.local, "cost", None)
        if cost is None and threading.current_thread().name == "chorus-announce":
            # llm.requested, stored beside the model call on a thread of its
            # own: the step's (with concurrent steps, perhaps another step's)
            return self.step
        return cost

    def prerun(self, task: Any = None, args: Any = (), **_: Any) -> None:
        self.local.cost = Cost(task.name, tuple(args or ()))
        if task.name == "chorus.step":
            self.step = self.local.cost

    def postrun(self, **_: Any) -> None:
        cost = self.current()
        if cost is not None:
            self.costs.append(cost)
        self.local.cost = None

    def statement(self, conn: Connection, _cursor: Any, sql: str, *_: Any) -> None:
        cost = self.current()
        if cost is None:
            return
        if conn.connection.dbapi_connection.autocommit:  # type: ignore[union-attr]
            # its own transaction, without BEGIN or COMMIT round trips
            cost.statements += 1
            cost.round_trips += 1
            if not sql.lstrip().upper().startswith("SELECT"):
                cost.commits += 1
            return
        if self.open.get(id(conn)) is False:  # psycopg sends BEGIN before the first
            self.open[id(conn)] = True
            cost.transactions += 1
            cost.commits += 1
            cost.round_trips += 1
        cost.statements += 1
        cost.round_trips += 1

    def begin(self, conn: Connection) -> None:
        if self.current() is not None:
            self.open[id(conn)] = False

    def end(self, conn: Connection) -> None:
        cost = self.current()
        if cost is not None and self.open.pop(id(conn), False):
            cost.round_trips += 1  # COMMIT or ROLLBACK

    def checkout(self, _dbapi: Any, record: Any, *_: Any) -> None:
        cost = self.current()
        if cost is None:
            return
        idle_since = record.info.get("idle_since")
        if idle_since is not None and time.monotonic() - idle_since >= PING_AFTER_IDLE:
            cost.round_trips += 1  # a connection idle a while is pinged


@pytest.fixture(scope="module")
def meter(settings: Settings) -> Iterator[tuple[Settings, Meter]]:
    """The in-process worker and its meter, shared by the module's tests (a
    process registers Chorus's tasks once); each test clears the costs."""
    own = settings.model_copy(update={"redis_prefix": f"chorus-queries-{uuid.uuid4().hex[:8]}"})
    engine = get_engine(own.db_url)
    meter = Meter()
    hooks: list[tuple[Any, str, Any]] = [
        (engine, "before_cursor_execute", meter.statement),
        (engine, "begin", meter.begin),
        (engine, "commit", meter.end),
        (engine, "rollback", meter.end),
    ]
    assert not engine.pool._pre_ping  # type: ignore[attr-defined]
    hooks.append((engine.pool, "checkout", meter.checkout))
    for target, name, fn in hooks:
        event.listen(target, name, fn)
    task_prerun.connect(meter.prerun, weak=False)
    task_postrun.connect(meter.postrun, weak=False)
    try:
        with in_process_worker(own, concurrency=8):
            yield own, meter
    finally:
        task_prerun.disconnect(meter.prerun)
        task_postrun.disconnect(meter.postrun)
        for target, name, fn in hooks:
            event.remove(target, name, fn)


def test_a_four_tool_step_costs_few_transactions_and_round_trips(
    meter: tuple[Settings, Meter],
) -> None:
    settings, counted = meter
    client = Client(settings)
    try:
        # a first turn warms the worker (imports, connections); not counted
        client.submit("four-tools", "steps=1").result(timeout=60)
        counted.costs.clear()
        job = client.submit("four-tools", f"steps={STEPS}")
        assert job.result(timeout=60) == f"done after {STEPS} steps"
    finally:
        client.close()
    by_step: dict[int, Cost] = {}
    tasks: dict[str, Cost] = {}
    # the warm-up's last chorus.step may end after its result was seen:
    # only the measured job's conversation is counted
    counted.costs = [
        c
        for c in counted.costs
        if c.task == "chorus.tool" or (c.args and c.args[0] == job.conversation_id)
    ]
    for cost in counted.costs:
        tasks.setdefault(cost.task, Cost(cost.task, ())).add(cost)
        if cost.task in ("chorus.step", "chorus.advance"):
            by_step.setdefault(int(cost.args[2]), Cost("step", ())).add(cost)
    tool_costs = [c for c in counted.costs if c.task == "chorus.tool"]
    assert len(tool_costs) == 4 * STEPS
    tools = Cost("tools", ())
    for c in tool_costs:
        tools.add(c)

    # a 4-tool step: its chorus.step, its chorus.advance and 4 chorus.tool
    per_step = Cost("per step", ())
    for step in range(STEPS):
        per_step.add(by_step[step])
    per_step.add(tools)
    figures = {
        "transactions": per_step.transactions / STEPS,
        "commits": per_step.commits / STEPS,
        "statements": per_step.statements / STEPS,
        "round trips": per_step.round_trips / STEPS,
    }
    print(f"\nPostgres per 4-tool step (mean of {STEPS} steps):")
    for name, value in figures.items():
        print(f"  {name:>12}: {value:.1f}")
    print("per task (mean):")
    for name, cost in sorted(tasks.items()):
        n = sum(1 for c in counted.costs if c.task == name)
        print(
            f"  {name:>15} x{n:<3} transactions {cost.transactions / n:.2f}  "
            f"commits {cost.commits / n:.2f}  "
            f"statements {cost.statements / n:.2f}  round trips {cost.round_trips / n:.2f}"
        )
    print(
        f"issue targets: transactions <= {TARGET_TRANSACTIONS}, round trips <= {TARGET_ROUND_TRIPS}"
    )
    assert figures["statements"] > 0, "no statement was counted: the meter listens elsewhere"
    assert figures["transactions"] <= TARGET_TRANSACTIONS
    assert figures["round trips"] <= TARGET_ROUND_TRIPS
    assert figures["commits"] <= MAX_COMMITS


def test_a_fan_out_costs_few_round_trips_per_child(meter: tuple[Settings, Meter]) -> None:
    settings, counted = meter
    client = Client(settings)
    try:
        client.submit("small-fanout", "go").result(timeout=60)  # warms the worker; not counted
        time.sleep(1.0)  # the warm-up's late tasks (an advance that finds nothing)
        counted.costs.clear()
        job = client.submit("small-fanout", "go")
        assert job.result(timeout=60) == f"children={SMALL_FANOUT}"
        time.sleep(0.5)  # an advance sent by a late child, after the result
    finally:
        client.close()
    total = Cost("fan-out", ())
    tasks: dict[str, list[Cost]] = {}
    for cost in counted.costs:
        total.add(cost)
        tasks.setdefault(cost.task, []).append(cost)
    print(f"\nPostgres per child of a {SMALL_FANOUT}-child fan-out (the parent's steps included):")
    for name in ("transactions", "commits", "statements", "round_trips"):
        print(f"  {name.replace('_', ' '):>12}: {getattr(total, name) / SMALL_FANOUT:.1f}")
    print("per task (mean):")
    for name, costs in sorted(tasks.items()):
        n = len(costs)
        print(
            f"  {name:>15} x{n:<3} transactions {sum(c.transactions for c in costs) / n:.2f}  "
            f"statements {sum(c.statements for c in costs) / n:.2f}  "
            f"round trips {sum(c.round_trips for c in costs) / n:.2f}"
        )
    assert total.statements > 0, "no statement was counted: the meter listens elsewhere"
    assert total.round_trips / SMALL_FANOUT <= MAX_ROUND_TRIPS_PER_CHILD
