"""Per-child cost of a subagent fan-out from ONE parent step, at several sizes.

What is measured
----------------
For each size N (``--sizes``, default 10,100,1000), the agent
``bench-fanout-<N>`` (``bench/fanout_tasks.py``) has a scripted model whose
first reply calls ``subagent__bench-fanout-child`` N times at once (one
parallelizable segment: a chord of N ``chorus.tool`` tasks, each creating a
child conversation and its turn); each child's model answers at once,
without tools; when the last child has answered, the parent's model
is called again and answers ``children=N ok=N`` (checked). A timed run is
``Client.submit(...).result()`` seen from this process: wall time from
submit to result, divided by N, is the **per-child cost**. Each size runs
``--repeats`` times (rounds over all sizes, so drift on the machine hits
every size alike); the table shows the median, and the ratio of the
largest median per-child cost to the smallest (flat fan-out: close to 1),
then the marginal cost per child between consecutive sizes and the fixed
per-turn part this leaves at the smallest size, which tells a fixed cost
(it weighs on small N) from a per-child cost that grows with N.

The child's model (``--model``): ``loopback`` (default) is
``openai/loopback-bench`` through litellm at an OpenAI-compatible server on
loopback answering at once (``bench/loopback_server.py``, its own process,
outside the workers' CPU): the openai SDK path that OpenAI-protocol
providers take, as in ``bench/step_overhead.py``. ``scripted`` is a
scripted model reached through litellm's custom-provider stream path, no
HTTP: its model client costs several ms of CPU more per child
(litellm's stream wrapper), all of it in the workers.

The warm-up (excluded) runs ``6 x --workers`` fan-outs of ``--warmup``
children at once, so that every worker process pays its first-use costs.
Before each run the fleet is idle: after a result the bench waits until no
task is queued or unacked ("drain": e.g. ``chorus.advance`` tasks of
children whose parent has already moved on), so a run never pays for the
previous one. A run whose turn has not ended while no task is queued or
running for 10 s is reported as stuck, with the workers' logged errors (no
sweeper runs here).

Workers are real processes started here: ``--workers`` copies of ``chorus
worker -Q llm,control,tools -P <pool> -c <concurrency>`` (default: two
processes of 8 threads, one per core of a 2-core box: a single process is
bound by its GIL), with ``CHORUS_MAX_CHILDREN=100000``. Redis is
``CHORUS_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) under a fresh
key prefix deleted at the end; Postgres is ``CHORUS_DATABASE_URL`` if set,
otherwise a database ``chorus_bench_<random>`` created on ``--admin-url``,
migrated, and dropped at the end.

Beside wall time the table shows CPU ms per child (the run and its drain)
of the workers' process groups (with the target beside it: <= 20 ms per
child at 1,000 children), of this client process and of the whole
machine (every core, every process: Postgres, Redis and any other load
included; the 1-min load average is printed to judge the latter). Then,
from the stored events' times (per size, median over the runs), where the
time goes: the parent's first step (submit → its model asked for the N
calls), starting all children (→ last ``subagent.started``), the children
(→ last child's ``turn.completed``), and the way back (last child → the
parent's ``turn.completed``), plus the median life of one child (its
``turn.started`` → ``turn.completed``: queueing included).

``--py-spy BIN`` samples the workers (``py-spy record --gil --nonblocking``)
during the timed runs and prints where their on-CPU Python time goes, per
child.

Run from the repo root::

    .venv/bin/python bench/fanout.py
    .venv/bin/python bench/fanout.py --sizes 10,100,1000,2000 --repeats 3
    .venv/bin/python bench/fanout.py --sizes 1000 --repeats 1 --model scripted
    .venv/bin/python bench/fanout.py --sizes 1000 --repeats 1 --py-spy /tmp/pyspy/bin/py-spy
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import signal
import socket
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(REPO))

from bench._harness import (  # noqa: E402
    DEFAULT_ADMIN,
    Worker,
    bench_main,
    client_services,
    group_cpu_seconds,
    machine_busy_seconds,
    model_server,
    print_py_spy,
    py_spy,
    raise_exit,
    self_cpu_seconds,
    wait_ready,
    worker_process,
)
from bench.loopback_agent import BASE_ENV  # noqa: E402
from orchestrator.celery_conf import queue_lists  # noqa: E402

TASKS_MODULE = "bench.fanout_tasks"
QUEUES = ("llm", "control", "tools")
#: The flatness the bench aims at: largest / smallest per-child cost.
TARGET_RATIO = 1.2
#: Worker CPU per child the bench aims at, at TARGET_SIZE children.
TARGET_CPU_MS = 20.0
TARGET_SIZE = 1000


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError("sizes must be positive integers")
    return sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--sizes",
        type=_sizes,
        default=[10, 100, 1000],
        help="comma-separated fan-out sizes (default 10,100,1000)",
    )
    p.add_argument("--repeats", type=int, default=2, help="timed runs per size (default 2)")
    p.add_argument(
        "--warmup",
        type=int,
        default=10,
        help="children of each excluded warm-up fan-out (default 10; 0: no warm-up)",
    )
    p.add_argument(
        "--model",
        choices=("loopback", "scripted"),
        default="loopback",
        help="the children's model: loopback: an OpenAI-compatible server answering "
        "at once (default); scripted: litellm's scripted provider, no HTTP",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--pool", default="threads", help="worker pool (default threads)")
    p.add_argument(
        "--concurrency", "-c", type=int, default=8, help="slots per worker process (default 8)"
    )
    p.add_argument("--admin-url", default=DEFAULT_ADMIN, help="Postgres to create the DB on")
    p.add_argument("--turn-timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--loglevel", default="WARNING", help="worker log level")
    p.add_argument(
        "--py-spy",
        metavar="BIN",
        help="sample the workers with this py-spy executable during the timed runs",
    )
    p.add_argument("--profile-top", type=int, default=25, help="rows of each py-spy table")
    p.add_argument("--keep-logs", action="store_true", help="keep and print where worker logs are")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must be 0 (none) or more")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    return args


# --- timed runs -----------------------------------------------------------


@dataclass
class Run:
    """One fan-out turn: its job, wall time and CPU spent."""

    size: int
    job_id: str
    root_id: str
    submitted: float  # epoch seconds (same clock as the events' times)
    seconds: float
    drained: float  # seconds after the result until the task queues were empty
    worker_cpu: float
    client_cpu: float
    machine_cpu: float

    @property
    def ms_per_child(self) -> float:
        return self.seconds * 1000 / self.size


@dataclass
class Fleet:
    """The worker processes: CPU accounting over all of them."""

    workers: list[Worker] = field(default_factory=list)

    def check(self) -> None:
        for worker in self.workers:
            worker.check()

    def cpu_seconds(self) -> float:
        return sum(group_cpu_seconds(w.proc.pid) for w in self.workers)

    def errors(self, lines: int = 40) -> str:
        """The first traceback-ish lines of every worker log (from the first ERROR)."""
        out = []
        for worker in self.workers:
            text = worker.log_path.read_text(errors="replace").splitlines()
            first = next((i for i, line in enumerate(text) if " ERROR " in line), None)
            if first is not None:
                out.append(f"[{worker.name}] " + "\n".join(text[first : first + lines]))
        return "\n".join(out) or "(none logged)"


def fan_out(client: Any, fleet: Fleet, size: int, timeout: float, queues: Queues) -> Run:
    """Submit the parent turn that fans out to ``size`` children; wait for its
    answer (the wall time), then for the queues to drain (its CPU is counted,
    its time is not)."""
    from bench.fanout_tasks import expected_answer, parent_agent

    fleet.check()
    worker_cpu, client_cpu, machine_cpu = (
        fleet.cpu_seconds(),
        self_cpu_seconds(),
        machine_busy_seconds(),
    )
    submitted = time.time()
    start = time.perf_counter()
    job = client.submit(parent_agent(size), f"fan out to {size} children")
    output = wait_result(job, timeout, queues, fleet)
    elapsed = time.perf_counter() - start
    drained = queues.drain()
    run = Run(
        size=size,
        job_id=job.id,
        root_id=job.root_id,
        submitted=submitted,
        seconds=elapsed,
        drained=drained,
        worker_cpu=fleet.cpu_seconds() - worker_cpu,
        client_cpu=self_cpu_seconds() - client_cpu,
        machine_cpu=machine_busy_seconds() - machine_cpu,
    )
    if output != expected_answer(size):
        raise RuntimeError(
            f"fan-out of {size} answered {output!r}, expected {expected_answer(size)!r}"
        )
    return run


#: Warm-up fan-outs run at once, per worker process: enough that every
#: process runs a parent's closing step with near certainty (missed with
#: probability 2 x (1/2)^12 = 0.05% with 2 workers). The first closing step
#: a process runs (its first step whose history holds tool results) took
#: ~0.8 s once, instead of ~0.02 s: a one-time lazy initialisation.
WARMUP_PER_WORKER = 6


def warm_up(
    client: Any, fleet: Fleet, size: int, count: int, timeout: float, queues: Queues
) -> float:
    """``count`` fan-outs of ``size`` children submitted at once; their wall time."""
    from bench.fanout_tasks import expected_answer, parent_agent

    start = time.perf_counter()
    jobs = [client.submit(parent_agent(size), f"warm-up {i}") for i in range(count)]
    for job in jobs:
        output = wait_result(job, timeout, queues, fleet)
        if output != expected_answer(size):
            raise RuntimeError(f"warm-up answered {output!r}, expected {expected_answer(size)!r}")
    elapsed = time.perf_counter() - start
    queues.drain()
    return elapsed


class Queues:
    """This run's Celery queues in Redis: how many tasks are waiting or in flight."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        import redis

        self.client = redis.Redis.from_url(redis_url)
        self.prefix = prefix

    def close(self) -> None:
        self.client.close()

    def in_flight(self) -> int:
        """Tasks waiting in a queue plus tasks delivered but not acked."""
        pipe = self.client.pipeline(transaction=False)
        for queue in QUEUES:
            for name in queue_lists(queue):
                pipe.llen(f"{self.prefix}:{name}")
        pipe.hlen(f"{self.prefix}:unacked")
        return sum(pipe.execute())

    def drain(self, timeout: float = 300.0) -> float:
        """Wait until no task waits or runs; return how long it took (work a
        run left behind: e.g. the ``chorus.advance`` tasks of children whose
        parent has already moved on)."""
        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            if not self.in_flight():
                return time.perf_counter() - start
            time.sleep(0.05)
        raise TimeoutError(f"the task queues did not drain within {timeout:.0f}s")


#: Seconds with no task queued or running (and no answer) before a run is
#: declared stuck: a task died on an exception and nothing will move the turn.
STALL_SECONDS = 10.0


def wait_result(job: Any, timeout: float, queues: Queues, fleet: Fleet) -> str:
    """``job.result(timeout)``, but fail fast when the fleet is idle and the
    turn has not ended (no sweeper runs here), with the workers' errors."""
    deadline = time.monotonic() + timeout
    idle_since: float | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"job {job.id} did not finish within {timeout:.0f}s")
        try:
            return str(job.result(timeout=min(2.0, remaining)))
        except TimeoutError:
            pass
        fleet.check()
        if queues.in_flight():
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > STALL_SECONDS:
            raise RuntimeError(
                f"job {job.id} is stuck: no task queued or running for {STALL_SECONDS:.0f}s "
                f"and the turn has not ended; worker errors:\n{fleet.errors()}"
            )


# --- reporting ------------------------------------------------------------


def report(runs: list[Run], sizes: list[int]) -> None:
    """Per size: median / min / max ms per child, median seconds per run,
    CPU ms per child; then the flatness ratio."""
    print()
    print(
        f"{'children':>8} {'runs':>4} {'median ms/child':>15} {'min':>8} {'max':>8}"
        f" {'run s':>8} {'drain s':>7}   cpu ms/child: {'workers':>7} {'client':>7}"
        f" {'machine':>8}"
    )
    medians: dict[int, float] = {}
    worker_ms: dict[int, float] = {}
    for size in sizes:
        mine = [r for r in runs if r.size == size]
        per_child = [r.ms_per_child for r in mine]
        medians[size] = statistics.median(per_child)
        children = size * len(mine)
        worker = worker_ms[size] = sum(r.worker_cpu for r in mine) * 1000 / children
        client = sum(r.client_cpu for r in mine) * 1000 / children
        machine = sum(r.machine_cpu for r in mine) * 1000 / children
        print(
            f"{size:>8} {len(mine):>4} {medians[size]:>15.2f} {min(per_child):>8.2f}"
            f" {max(per_child):>8.2f} {statistics.median(r.seconds for r in mine):>8.2f}"
            f" {statistics.median(r.drained for r in mine):>7.2f}"
            f"{'':>17}{worker:>7.1f} {client:>7.1f} {machine:>8.1f}"
        )
    high = max(medians, key=lambda n: medians[n])
    low = min(medians, key=lambda n: medians[n])
    ratio = medians[high] / medians[low]
    verdict = "flat" if ratio <= TARGET_RATIO else "NOT flat"
    print(
        f"ratio largest / smallest per-child cost: {ratio:.2f} "
        f"(N={high}: {medians[high]:.2f} ms / N={low}: {medians[low]:.2f} ms; "
        f"target <= {TARGET_RATIO}: {verdict})"
    )
    marginal(medians)
    cpu_target(worker_ms)
    print(
        f"({os.cpu_count()} cores; wall: submit to result seen by the client, / children."
        " drain: after the\n result until the task queues were empty (not in the wall time)."
        " cpu: the run and its\n drain, / children; machine: every process, other load"
        f" included (1-min load average now {os.getloadavg()[0]:.2f}))"
    )


def cpu_target(worker_ms: dict[int, float]) -> None:
    """Worker CPU per child at TARGET_SIZE children (else the largest size
    run) against the target."""
    size = TARGET_SIZE if TARGET_SIZE in worker_ms else max(worker_ms)
    verdict = "met" if worker_ms[size] <= TARGET_CPU_MS else "NOT met"
    note = "" if size == TARGET_SIZE else f" (the target is set at N={TARGET_SIZE})"
    print(
        f"target: worker CPU <= {TARGET_CPU_MS:.0f} ms/child at N={size}: "
        f"{worker_ms[size]:.1f} ms, {verdict}{note}"
    )


def marginal(medians: dict[int, float]) -> None:
    """Split the run time into a fixed part and a per-child part: the marginal
    cost per child between consecutive sizes (flat when no per-child cost
    grows with N), and the fixed per-turn cost it leaves at the smallest size
    (what makes a small fan-out dearer per child)."""
    sizes = sorted(medians)
    if len(sizes) < 2:
        return
    seconds = {n: medians[n] * n / 1000 for n in sizes}
    slopes = {(a, b): (seconds[b] - seconds[a]) / (b - a) for a, b in itertools.pairwise(sizes)}
    (a, b), first = next(iter(slopes.items()))
    fixed = seconds[a] - a * first
    print(
        "marginal ms/child "
        + ", ".join(f"{x}→{y}: {m * 1000:.2f}" for (x, y), m in slopes.items())
        + f"; fixed per-turn part ≈ {fixed:.2f} s (run({a}) - {a} x marginal {a}→{b})"
    )


#: Stored events that bound the phases of a fan-out.
_PHASE_EVENTS = ("llm.completed", "subagent.started", "turn.started", "turn.completed")


@dataclass
class Timeline:
    """Seconds from submit to each point of one run, from stored events."""

    parent_asked: float  # the parent's first model call stored its N calls
    last_started: float  # last subagent.started (child conversation + turn created)
    first_done: float  # first child turn.completed
    last_done: float  # last child turn.completed (it answered the parent's call)
    answered: float  # the parent's turn.completed
    seen: float  # the client saw the result
    child_life: float  # median child turn.started → turn.completed


def timeline(client: Any, run: Run) -> Timeline | None:
    from sqlmodel import col, select

    from orchestrator.store.tables import EventRow

    with client.runtime.session() as session:
        rows = session.exec(
            select(
                EventRow.conversation_id,
                EventRow.turn_id,
                EventRow.step,
                EventRow.name,
                EventRow.created_at,
            ).where(EventRow.root_id == run.root_id, col(EventRow.name).in_(_PHASE_EVENTS))
        ).all()

    def rel(t: datetime) -> float:
        return t.timestamp() - run.submitted

    parent_asked = answered = None
    started: list[float] = []
    child_start: dict[str, float] = {}
    child_end: dict[str, float] = {}
    for conversation_id, turn_id, step, name, created in rows:
        at = rel(created)
        is_parent = conversation_id == run.root_id
        if is_parent and name == "llm.completed" and step == 0:
            parent_asked = at
        elif is_parent and name == "subagent.started":
            started.append(at)
        elif is_parent and name == "turn.completed" and turn_id == run.job_id:
            answered = at
        elif not is_parent and turn_id and name == "turn.started":
            child_start[turn_id] = at
        elif not is_parent and turn_id and name == "turn.completed":
            child_end[turn_id] = at
    if parent_asked is None or answered is None or not started or not child_end:
        return None
    lives = [child_end[t] - child_start[t] for t in child_end if t in child_start]
    return Timeline(
        parent_asked=parent_asked,
        last_started=max(started),
        first_done=min(child_end.values()),
        last_done=max(child_end.values()),
        answered=answered,
        seen=run.seconds,
        child_life=statistics.median(lives) if lives else float("nan"),
    )


def _median(values: Iterator[float]) -> float:
    return statistics.median(list(values))


def report_phases(client: Any, runs: list[Run], sizes: list[int]) -> None:
    """Where the time goes, per size (medians over the runs)."""
    lines = []
    for size in sizes:
        points = [t for r in runs if r.size == size and (t := timeline(client, r)) is not None]
        if not points:
            continue
        first_step = _median(t.parent_asked for t in points)
        starting = _median(t.last_started - t.parent_asked for t in points)
        children = _median(t.last_done - t.parent_asked for t in points)
        back = _median(t.answered - t.last_done for t in points)
        seen = _median(t.seen - t.answered for t in points)
        life = _median(t.child_life for t in points)
        lines.append(
            f"{size:>8} {first_step:>10.2f} {starting:>10.2f} {starting * 1000 / size:>8.2f}"
            f" {children:>10.2f} {children * 1000 / size:>8.2f} {back:>10.2f} {seen:>8.2f}"
            f" {life:>10.2f}"
        )
    if not lines:
        return
    print("\nwhere the time goes (stored event times; seconds, median over runs)")
    print(
        f"{'children':>8} {'1st step':>10} {'start all':>10} {'ms/child':>8}"
        f" {'last done':>10} {'ms/child':>8} {'way back':>10} {'client':>8} {'child life':>10}"
    )
    for line in lines:
        print(line)
    print(
        "  1st step: submit → the parent's model stored its N calls; start all: → last\n"
        "  subagent.started (chorus.tool created the child); last done: 1st step → last\n"
        "  child's turn.completed; way back: last child → the parent's turn.completed;\n"
        "  client: → result seen by the client; child life: median turn.started →\n"
        "  turn.completed of one child (queueing for a slot included)"
    )


# --- main -----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    return bench_main(parse_args(argv), run, "chorus-bench-fanout-")


def loopback(args: argparse.Namespace, stack: ExitStack, workdir: Path) -> dict[str, str]:
    """With ``--model loopback``: start the model server (0 latency) and
    return the settings that point the children's agent at it (for this
    process and the workers)."""
    if args.model != "loopback":
        return {}
    server_env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = stack.enter_context(model_server(0.0, workdir, server_env))
    # the loopback server ignores the key; litellm's OpenAI provider wants one
    return {BASE_ENV: server.base_url, "OPENAI_API_KEY": "bench-dummy-key"}


def run(args: argparse.Namespace, workdir: Path) -> int:
    """Start the services and workers, time every size, print the results."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_exit)
    run_id = secrets.token_hex(4)
    prefix = f"chorus-bench-fanout-{run_id}"
    bindir = Path(sys.executable).parent
    registered = sorted({*args.sizes, *([args.warmup] if args.warmup else [])})

    with ExitStack() as stack:
        redis_url, db_url = client_services(
            stack,
            args.admin_url,
            run_id,
            prefix,
            TASKS_MODULE,
            CHORUS_MAX_CHILDREN="100000",
            CHORUS_BENCH_FANOUT_SIZES=",".join(str(n) for n in registered),
            **loopback(args, stack, workdir),
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        )

        from orchestrator.store.migrate import upgrade

        upgrade(db_url)
        fleet = Fleet()
        host = socket.gethostname()
        nodes = []
        for i in range(args.workers):
            node = f"bench-fanout-{run_id}-{i}"
            cmd = [str(bindir / "chorus"), "worker", "-Q", "llm,control,tools"]
            cmd += ["-P", args.pool, "-c", str(args.concurrency), "-l", args.loglevel]
            cmd += ["-n", f"{node}@%h"]
            fleet.workers.append(
                stack.enter_context(
                    worker_process(f"worker{i}", cmd, env, workdir / f"worker{i}.log")
                )
            )
            nodes.append(f"{node}@{host}")

        from orchestrator import Client
        from orchestrator.settings import load_settings

        client = Client(load_settings())
        stack.callback(client.close)
        print(
            f"fan-out from one parent step: sizes {','.join(map(str, args.sizes))}, "
            f"{args.repeats} runs each; children's model {args.model}; "
            f"{args.workers} worker(s) x {args.pool} "
            f"-c {args.concurrency}; redis {redis_url}, db {db_url.rsplit('/', 1)[-1]}; "
            f"1-min load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        t0 = time.monotonic()
        for worker, node in zip(fleet.workers, nodes, strict=True):
            wait_ready(client.celery, worker, node=node)
        print(f"workers ready in {time.monotonic() - t0:.1f}s", flush=True)

        queues = Queues(redis_url, prefix)
        stack.callback(queues.close)
        queues.drain()
        if args.warmup:
            count = WARMUP_PER_WORKER * args.workers
            seconds = warm_up(client, fleet, args.warmup, count, args.turn_timeout, queues)
            print(
                f"warm-up  {count} fan-outs of {args.warmup} children at once: "
                f"{seconds:.2f} s (excluded)",
                flush=True,
            )
        runs: list[Run] = []
        with py_spy(args.py_spy, fleet.workers, workdir) as samples:
            for repeat in range(args.repeats):
                for size in args.sizes:
                    done = fan_out(client, fleet, size, args.turn_timeout, queues)
                    runs.append(done)
                    print(
                        f"run {repeat + 1:<3} {size:>5} children {done.seconds:8.2f} s "
                        f"{done.ms_per_child:8.2f} ms/child (queues drained "
                        f"{done.drained:.2f} s later)",
                        flush=True,
                    )
        report(runs, args.sizes)
        report_phases(client, runs, args.sizes)
        children = sum(r.size for r in runs)
        for name, path in samples.items():
            print_py_spy(name, path, children, args.profile_top, unit="child")
    return 0


if __name__ == "__main__":
    sys.exit(main())
