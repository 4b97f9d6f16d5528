"""Per-step overhead of Chorus, against raw Celery running the same canvas.

What is measured
----------------
(a) **Chorus**: an agent whose model asks for 4 parallelizable no-op tool
    calls per step for ``--steps`` steps, then answers with text. With
    ``--model loopback`` (default) it is ``bench-loopback``
    (``bench/loopback_agent.py``): ``openai/loopback-bench`` through litellm
    at an OpenAI-compatible server on loopback that answers at once
    (``bench/loopback_server.py``, its own process, 0 latency); with
    ``--model scripted`` it is ``bench-step-overhead``, a scripted model
    reached through litellm (``orchestrator.llm.scripted``), no HTTP. Each
    timed turn is ``Client.submit(...).result()`` seen from this process:
    the turn's wall time divided by ``--steps``. A turn is ``--steps`` steps
    of ``chorus.step`` → ``chord(group(4 x chorus.tool), chorus.advance)``,
    plus the closing ``chorus.step`` whose model answers (its cost is spread
    over the steps, the same way on every side).
(b) **raw celery**: the same shape with nothing but Celery and no model:
    ``bench.step`` → ``chord(group(4 x bench.tool), bench.advance)`` →
    ``bench.step`` … for the same number of steps, then a closing
    ``bench.step`` that pushes to a Redis list the client waits on (BLPOP).
    Same configuration (:func:`orchestrator.celery_conf.celery_config`: JSON,
    acks late, prefetch 1, task events), its own Redis prefix, and a worker
    with the same pool, concurrency and queues.
(c) **raw + model**: (b) whose step task makes the same model call as
    Chorus through the same model client: ``orchestrator.llm.call.complete``
    on the same model with the same system prompt, history and tool
    (``bench.model_step`` / ``bench.model_advance``, the history carried in
    the task arguments). Chorus / (b) is the whole overhead; Chorus / (c)
    separates the canvas's bookkeeping from the model client's cost.
(d) the ratios of the median per-step times, and the targets: Chorus /
    raw + model <= 1.5 in wall time, Chorus worker CPU <= 25 ms per step.

Both workers are real processes started here (``chorus worker`` and
``celery -A bench.step_overhead_tasks worker``, both ``-Q llm,control,tools``
with ``--pool``/``--concurrency``), cwd the repo root and ``PYTHONPATH`` set
to it. Redis is ``CHORUS_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``),
with fresh key prefixes deleted at the end. Postgres is
``CHORUS_DATABASE_URL`` if set; otherwise a database
``chorus_bench_<random>`` is created on ``--admin-url``, migrated, and
dropped at the end. One warm-up turn per side is excluded from timing
(litellm's lazy imports, first connections); then the timed turns of the
sides alternate, so drift on the machine hits all alike. Each Chorus
turn is a new conversation (history grows within a turn, as in real use).

Beside wall time the table shows CPU ms per step of each worker's process
group, of this client process, and of the whole machine (all cores, every
process: Postgres, Redis and the model server included, and whatever else
runs). It then splits a Chorus step's wall time into phases from the stored
events' times (model call; persist + dispatch + hop to the tools; the tool
batch; chord + ``chorus.advance`` + hop to the next step).

Profiling (after the warm-up, timed turns only):

- ``--profile``: cProfile around every task of both workers (one profiler
  per pool thread, wall clock by default, ``--profile-timer cpu`` for
  per-thread CPU); both distort the timings (cProfile costs ~1.5-2x).
- ``--py-spy BIN``: ``py-spy record --gil --nonblocking`` on both workers:
  where the Python CPU goes, with little distortion.
- ``--task-cpu``: per task name, the CPU time and context switches of the
  pool thread that ran it (Linux ``/proc``), little distortion: which task
  costs what against its raw twin. On this VM a context switch costs CPU
  (the kernel's switch path was about a fifth of a worker's CPU), so the
  switches column tracks blocking round trips and GIL hand-offs.

Run from the repo root::

    .venv/bin/python bench/step_overhead.py
    .venv/bin/python bench/step_overhead.py --model scripted
    .venv/bin/python bench/step_overhead.py --steps 20 --turns 5 --pool threads -c 8 --profile
    .venv/bin/python bench/step_overhead.py --turns 5 --py-spy "$(command -v py-spy)"
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import signal
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(REPO))

from bench._harness import (  # noqa: E402
    DEFAULT_ADMIN,
    DEFAULT_REDIS,
    Worker,
    bench_main,
    chorus_worker_cmd,
    database,
    group_cpu_seconds,
    machine_busy_seconds,
    model_server,
    print_py_spy,
    purge_redis,
    py_spy,
    raise_exit,
    self_cpu_seconds,
    wait_ready,
    worker_process,
)
from bench.loopback_agent import (  # noqa: E402
    BASE_ENV,
    LOOPBACK_AGENT,
    expected_answer,
    job_input,
    register,
)

TASKS_MODULE = "bench.step_overhead_tasks"
RAW_MODEL = "raw + model"
#: Chorus / raw + model, wall time per step.
TARGET_RATIO = 1.5
#: Chorus worker CPU per 4-tool step.
TARGET_CPU_MS = 25.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=20, help="tool steps per turn (default 20)")
    p.add_argument("--turns", type=int, default=3, help="timed turns per side (default 3)")
    p.add_argument(
        "--model",
        choices=("loopback", "scripted"),
        default="loopback",
        help="loopback: an OpenAI-compatible server answering at once (default); "
        "scripted: litellm's scripted provider, no HTTP",
    )
    p.add_argument("--pool", default="threads", help="worker pool for both sides")
    p.add_argument("--concurrency", "-c", type=int, default=8, help="worker concurrency")
    p.add_argument("--admin-url", default=DEFAULT_ADMIN, help="Postgres to create the DB on")
    p.add_argument("--turn-timeout", type=float, default=300.0, help="seconds per turn")
    p.add_argument("--loglevel", default="WARNING", help="worker log level (both sides)")
    p.add_argument("--profile", action="store_true", help="cProfile every task after warm-up")
    p.add_argument(
        "--profile-timer",
        choices=("wall", "cpu"),
        default="wall",
        help="cProfile clock: wall (latency on the critical path) or per-thread CPU",
    )
    p.add_argument("--profile-top", type=int, default=25, help="rows of each profile table")
    p.add_argument(
        "--task-cpu",
        action="store_true",
        help="per task name: CPU and context switches of the pool thread that ran each task "
        "after warm-up (not the tool helper threads')",
    )
    p.add_argument(
        "--py-spy",
        metavar="BIN",
        help="sample both workers with this py-spy executable during the timed turns",
    )
    p.add_argument(
        "--tracing",
        action="store_true",
        help="also time Chorus with tracing on: a second chorus worker exporting every span "
        "over OTLP/HTTP to a receiver in this process (the side 'chorus traced')",
    )
    p.add_argument("--keep-logs", action="store_true", help="print where worker logs are")
    args = p.parse_args(argv)
    if args.steps < 1 or args.steps > 998:
        p.error("--steps must be between 1 and 998 (the agent's max_steps is 1000)")
    if args.turns < 1:
        p.error("--turns must be at least 1")
    return args


# --- the two sides --------------------------------------------------------


@dataclass
class Side:
    """One side of the comparison: how to run a turn, and its timings."""

    name: str
    run_turn: Callable[[], None]
    worker: Worker
    seconds: list[float] = field(default_factory=list)
    worker_cpu: float = 0.0
    client_cpu: float = 0.0
    machine_cpu: float = 0.0

    def timed(self, steps: int) -> float:
        self.worker.check()
        worker_cpu, client_cpu = group_cpu_seconds(self.worker.proc.pid), self_cpu_seconds()
        machine_cpu = machine_busy_seconds()
        start = time.perf_counter()
        self.run_turn()
        elapsed = time.perf_counter() - start
        self.machine_cpu += machine_busy_seconds() - machine_cpu
        self.worker_cpu += group_cpu_seconds(self.worker.proc.pid) - worker_cpu
        self.client_cpu += self_cpu_seconds() - client_cpu
        self.seconds.append(elapsed)
        return elapsed * 1000 / steps

    def reset(self) -> None:
        self.seconds.clear()
        self.worker_cpu = self.client_cpu = self.machine_cpu = 0.0


def chorus_turn(
    client: Any, agent: str, text: str, expected: str, timeout: float, job_ids: list[str]
) -> Callable[[], None]:
    def run() -> None:
        job = client.submit(agent, text)
        job_ids.append(job.id)
        output = job.result(timeout=timeout)
        if output != expected:
            raise RuntimeError(f"chorus turn answered {output!r}, expected {expected!r}")

    return run


def wait_done(client: Any, key: str, timeout: float) -> str:
    """BLPOP ``key`` in 1 s slices (the broker URL's socket timeout may be
    shorter than a turn) until ``timeout``; the value pushed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = client.blpop([key], timeout=1)
        if done is not None:
            return str(done[1].decode())
    raise TimeoutError(f"{key} was not pushed within {timeout:.0f}s")


def raw_turn(tasks: Any, prefix: str, steps: int, timeout: float) -> Callable[[], None]:
    import redis

    client = redis.Redis.from_url(tasks.app.conf.broker_url)

    def run() -> None:
        run_id = uuid.uuid4().hex
        tasks.raw_step.apply_async((run_id, 0, steps))
        wait_done(client, tasks.done_key(prefix, run_id), timeout)

    return run


def raw_model_turn(
    tasks: Any, prefix: str, model: str, settings: dict[str, Any], steps: int, timeout: float
) -> Callable[[], None]:
    import redis

    client = redis.Redis.from_url(tasks.app.conf.broker_url)
    expected = expected_answer(steps)
    messages = tasks.first_messages(job_input(steps, tasks.TOOLS_PER_STEP))

    def run() -> None:
        run_id = uuid.uuid4().hex
        tasks.raw_model_step.apply_async((run_id, model, settings, messages))
        answer = wait_done(client, tasks.done_key(prefix, run_id), timeout)
        if answer != expected:
            raise RuntimeError(f"raw + model turn answered {answer!r}, expected {expected!r}")

    return run


# --- reporting ------------------------------------------------------------


def report(sides: list[Side], steps: int) -> None:
    """The table: wall ms per step (median, min, max) and CPU ms per step:
    the worker's process group, this client process, and the whole machine
    (every core, every process: Postgres and Redis included, and any
    unrelated load)."""
    print()
    print(
        f"{'':<12} {'turns':>5} {'steps':>5} {'median ms/step':>15} {'min':>8} {'max':>8}"
        f"   cpu ms/step: {'worker':>7} {'client':>7} {'machine':>8}"
    )
    medians = []
    for side in sides:
        values = [t * 1000 / steps for t in side.seconds]
        medians.append(statistics.median(values))
        done = len(values) * steps
        print(
            f"{side.name:<12} {len(values):>5} {steps:>5} {medians[-1]:>15.2f} "
            f"{min(values):>8.2f} {max(values):>8.2f}"
            f"{'':>15}{side.worker_cpu * 1000 / done:>7.1f} {side.client_cpu * 1000 / done:>7.1f}"
            f" {side.machine_cpu * 1000 / done:>8.1f}"
        )
    for i, side in list(enumerate(sides))[1:]:
        print(
            f"{'ratio':<12} {'':>5} {'':>5} {medians[0] / medians[i]:>15.2f}"
            f"   (chorus / {side.name})"
        )
    with_model = next((i for i, side in enumerate(sides) if side.name == RAW_MODEL), None)
    if with_model is not None:
        ratio = medians[0] / medians[with_model]
        verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
        print(f"target: chorus / {RAW_MODEL} wall <= {TARGET_RATIO}: {ratio:.2f}, {verdict}")
    chorus = sides[0]
    cpu = chorus.worker_cpu * 1000 / (len(chorus.seconds) * steps)
    verdict = "met" if cpu <= TARGET_CPU_MS else "NOT met"
    print(f"target: chorus worker CPU <= {TARGET_CPU_MS:.0f} ms/step: {cpu:.1f} ms, {verdict}")
    print(f"({os.cpu_count()} cores; wall = submit to result seen by the client, / steps)")


#: Stored events that bound the phases of a Chorus step.
_PHASE_EVENTS = ("llm.requested", "llm.completed", "tool.started", "tool.completed")


def chorus_phases(client: Any, job_ids: list[str]) -> None:
    """Where a Chorus step's wall time goes, from the stored events' times.

    Per tool step s: model (llm.requested → llm.completed), to tools
    (llm.completed → first tool.started: persist, dispatch, broker hop),
    tools (first tool.started → last tool.completed), and back to the model
    (last tool.completed → llm.requested of step s+1: chord counter,
    ``chorus.advance``, ``chorus.step`` start, history load).
    """
    from sqlmodel import col, select

    from orchestrator.store.tables import EventRow

    if not job_ids:
        return
    with client.runtime.session() as session:
        rows = session.exec(
            select(EventRow.turn_id, EventRow.step, EventRow.name, EventRow.created_at).where(
                col(EventRow.turn_id).in_(job_ids), col(EventRow.name).in_(_PHASE_EVENTS)
            )
        ).all()
    first: dict[tuple[str | None, int | None, str], float] = {}
    last: dict[tuple[str | None, int | None, str], float] = {}
    for turn_id, step, name, created in rows:
        key, t = (turn_id, step, name), created.timestamp()
        first[key] = min(first.get(key, t), t)
        last[key] = max(last.get(key, t), t)
    phases: dict[str, list[float]] = {
        "model call": [],
        "persist + dispatch + hop to tools": [],
        "tool batch (4 in parallel)": [],
        "chord + advance + hop to next step": [],
    }
    for (turn_id, step, name), t_req in first.items():
        if name != "llm.requested" or step is None:
            continue
        try:
            points = (
                t_req,
                first[(turn_id, step, "llm.completed")],
                first[(turn_id, step, "tool.started")],
                last[(turn_id, step, "tool.completed")],
                first[(turn_id, step + 1, "llm.requested")],
            )
        except KeyError:
            continue  # the closing step: no tools
        for values, (a, b) in zip(phases.values(), itertools.pairwise(points), strict=True):
            values.append((b - a) * 1000)
    if not any(phases.values()):
        return
    print("\nchorus step phases (stored event times), ms: median / mean")
    for phase, values in phases.items():
        print(f"  {phase:<36} {statistics.median(values):8.2f} {statistics.fmean(values):8.2f}")
    means = sum(statistics.fmean(v) for v in phases.values())
    print(f"  {'sum of means':<36} {'':>8} {means:8.2f}")


def print_profile(title: str, directory: Path, steps_profiled: int, top: int) -> None:
    """Top functions of a worker's task profile, in ms per step."""
    import pstats

    files = sorted(directory.glob("tasks-*.pstats"))
    if not files:
        print(f"\n[{title}] no profile written (worker did not shut down cleanly?)")
        return
    stats = pstats.Stats(*(str(f) for f in files))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    rows = [(func, cc, nc, tt, ct) for func, (cc, nc, tt, ct, _callers) in raw.items()]

    def label(func: tuple[str, int, str]) -> str:
        filename, line, fn = func
        short = filename
        for marker in ("site-packages/", str(REPO) + "/", "/lib/python3"):
            if marker in short:
                short = short.split(marker, 1)[1]
                break
        return f"{short}:{line}({fn})" if line else fn

    print(f"\n[{title}] {steps_profiled} steps profiled; ms per step")
    for heading, key in (("own time (tottime)", 3), ("cumulative (cumtime)", 4)):
        print(f"  -- top {top} by {heading}")
        print(f"  {'tottime':>9} {'cumtime':>9} {'calls/step':>10}  function")
        for func, _cc, nc, tt, ct in sorted(rows, key=lambda r: r[key], reverse=True)[:top]:
            print(
                f"  {tt * 1000 / steps_profiled:>9.3f} {ct * 1000 / steps_profiled:>9.3f} "
                f"{nc / steps_profiled:>10.1f}  {label(func)[:110]}"
            )


def print_task_cpu(title: str, directory: Path, steps: int) -> None:
    """Per task name: tasks, thread CPU and context switches a task, and the
    pool threads' CPU a step (the consumer's own thread is not in it)."""
    files = sorted(directory.glob("taskcpu-*.json"))
    if not files:
        print(f"\n[{title}] no task CPU written (worker did not shut down cleanly?)")
        return
    rows: dict[str, list[float]] = {}
    for path in files:
        for name, (tasks, cpu, switches) in json.loads(path.read_text()).items():
            row = rows.setdefault(name, [0, 0.0, 0])
            row[0], row[1], row[2] = row[0] + tasks, row[1] + cpu, row[2] + switches
    print(f"\n[{title}] task CPU (pool threads), {steps} steps")
    heads = ("cpu ms/task", "switches/task", "cpu ms/step")
    print(f"  {'task':<22} {'tasks':>6} {heads[0]:>12} {heads[1]:>14} {heads[2]:>12}")
    for name, (tasks, cpu, switches) in sorted(rows.items()):
        print(
            f"  {name:<22} {tasks:>6.0f} {cpu * 1000 / tasks:>12.2f} "
            f"{switches / tasks:>14.1f} {cpu * 1000 / steps:>12.2f}"
        )


def profiling_env(args: argparse.Namespace, directory: Path) -> dict[str, str]:
    """A worker's environment for ``--profile`` and ``--task-cpu`` (its
    directory created), or nothing."""
    env = {}
    if args.profile:
        env["BENCH_PROFILE"] = str(directory)
        env["BENCH_PROFILE_TIMER"] = args.profile_timer
    if args.task_cpu:
        env["BENCH_TASK_CPU"] = str(directory)
    if env:
        directory.mkdir()
    return env


def start_profiling(args: argparse.Namespace, dirs: dict[str, Path]) -> None:
    """Tell the workers to profile from now on (``--profile``, ``--task-cpu``)."""
    if args.profile or args.task_cpu:
        for directory in dirs.values():
            (directory / "on").touch()


def print_profiles(args: argparse.Namespace, dirs: dict[str, Path]) -> None:
    """What the stopped workers wrote: ``--profile`` and ``--task-cpu``."""
    steps = args.turns * args.steps
    if args.profile:
        print_profile("chorus worker", dirs["chorus"], steps, args.profile_top)
        print_profile("raw worker", dirs["raw"], steps, args.profile_top)
    if args.task_cpu:
        print_task_cpu("chorus worker", dirs["chorus"], steps)
        print_task_cpu("raw worker (both rows)", dirs["raw"], steps)


# --- tracing on -------------------------------------------------------------

TRACED = "chorus traced"


@dataclass
class Traced:
    """The ``--tracing`` side: a chorus worker of its own (own Redis prefix)
    with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, exporting to ``receiver``."""

    worker: Worker
    node: str
    prefix: str
    receiver: Any
    job_ids: list[str] = field(default_factory=list)

    def side(self, agent: str, text: str, expected: str, timeout: float, stack: ExitStack) -> Side:
        from orchestrator import Client
        from orchestrator.settings import load_settings

        client = Client(load_settings(redis_prefix=self.prefix))
        stack.callback(client.close)
        wait_ready(client.celery, self.worker, node=self.node)
        run = chorus_turn(client, agent, text, expected, timeout, self.job_ids)
        return Side(TRACED, run, self.worker)

    def report(self, off: Side, on: Side, steps: int) -> None:
        """Tracing's cost: on / off in wall time and worker CPU, and what was sent."""
        wall = statistics.median(on.seconds) / statistics.median(off.seconds)
        cpu_off, cpu_on = (s.worker_cpu * 1000 / (len(s.seconds) * steps) for s in (off, on))
        time.sleep(6)  # the batch processor's schedule delay is 5 s: let it send the rest
        spans = self.receiver.received()
        traces = {span.trace_id for span in spans}
        print(
            f"tracing: on / off wall {wall:.2f}; worker CPU {cpu_on:.1f} against {cpu_off:.1f} "
            f"ms/step ({cpu_on - cpu_off:+.1f}); {len(spans)} spans received in "
            f"{len(traces)} traces ({len(spans) / max(len(traces) * steps, 1):.1f} a step)"
        )


@contextmanager
def traced_worker(
    args: argparse.Namespace, run_id: str, base_env: dict[str, str], workdir: Path, redis_url: str
) -> Iterator[Traced | None]:
    """With ``--tracing``: the OTLP receiver and the traced chorus worker."""
    if not args.tracing:
        yield None
        return
    from tests.otlp import otlp_receiver

    prefix, node = f"chorus-bench-traced-{run_id}", f"bench-traced-{run_id}"
    with ExitStack() as stack:
        receiver = stack.enter_context(otlp_receiver())
        stack.callback(purge_redis, redis_url, [prefix])
        env = {
            **base_env,
            "CHORUS_REDIS_PREFIX": prefix,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_SERVICE_NAME": "chorus-bench",
        }
        worker = stack.enter_context(
            worker_process(
                "traced",
                chorus_worker_cmd(node, args.pool, args.concurrency, args.loglevel),
                env,
                workdir / "traced-worker.log",
            )
        )
        yield Traced(worker, f"{node}@{socket.gethostname()}", prefix, receiver)


# --- main -----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    return bench_main(parse_args(argv), run, "chorus-bench-")


def loopback(
    args: argparse.Namespace, stack: ExitStack, workdir: Path, env_vars: dict[str, str]
) -> dict[str, Any]:
    """With ``--model loopback``: start the model server (0 latency), point the
    workers' environment at it, and return the model settings of its agent."""
    if args.model != "loopback":
        return {}
    server_env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = stack.enter_context(model_server(0.0, workdir, server_env))
    env_vars[BASE_ENV] = server.base_url
    env_vars["OPENAI_API_KEY"] = "bench-dummy-key"  # the loopback server ignores it
    return {"api_base": server.base_url}


def run(args: argparse.Namespace, workdir: Path) -> int:
    """Start the services and workers, time every side, print the results."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_exit)
    run_id = secrets.token_hex(4)
    redis_url = os.environ.get("CHORUS_REDIS_URL") or DEFAULT_REDIS
    chorus_prefix, raw_prefix = f"chorus-bench-{run_id}", f"chorus-bench-raw-{run_id}"
    bindir = Path(sys.executable).parent

    with ExitStack() as stack:
        db_url = stack.enter_context(database(args.admin_url, run_id))
        stack.callback(purge_redis, redis_url, [chorus_prefix, raw_prefix])
        env_vars = {
            "CHORUS_REDIS_URL": redis_url,
            "CHORUS_DATABASE_URL": db_url,
            "CHORUS_REDIS_PREFIX": chorus_prefix,
            "CHORUS_MODULES": TASKS_MODULE,
            "BENCH_RAW_PREFIX": raw_prefix,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        model_settings = loopback(args, stack, workdir, env_vars)
        os.environ.update(env_vars)  # this process is the client of every side
        base_env = {
            k: v for k, v in os.environ.items() if k not in {"BENCH_PROFILE", "BENCH_TASK_CPU"}
        }
        base_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        )
        profile_dirs = {name: workdir / f"profile-{name}" for name in ("chorus", "raw")}

        def env_for(name: str) -> dict[str, str]:
            return {**base_env, **profiling_env(args, profile_dirs[name])}

        from orchestrator.store.migrate import upgrade

        upgrade(db_url)
        pool = ["-Q", "llm,control,tools", "-P", args.pool, "-c", str(args.concurrency)]
        chorus_worker = stack.enter_context(
            worker_process(
                "chorus",
                chorus_worker_cmd(
                    f"bench-chorus-{run_id}", args.pool, args.concurrency, args.loglevel
                ),
                env_for("chorus"),
                workdir / "chorus-worker.log",
            )
        )
        traced = stack.enter_context(traced_worker(args, run_id, base_env, workdir, redis_url))
        raw_worker = stack.enter_context(
            worker_process(
                "raw",
                [
                    str(bindir / "celery"),
                    "-A",
                    TASKS_MODULE,
                    "worker",
                    *pool,
                    "-E",
                    "-l",
                    args.loglevel,
                    "-n",
                    f"bench-raw-{run_id}@%h",
                ],
                env_for("raw"),
                workdir / "raw-worker.log",
            )
        )

        import bench.step_overhead_tasks as tasks
        from orchestrator import Client, registry
        from orchestrator.settings import load_settings

        if model_settings:
            register(model_settings["api_base"])
        agent = LOOPBACK_AGENT if model_settings else tasks.AGENT
        model = registry.get_agent(agent).model
        client = Client(load_settings())
        stack.callback(client.close)
        print(
            f"chorus vs raw Celery: {args.steps} steps x {tasks.TOOLS_PER_STEP} no-op tools, "
            f"model {model}, "
            f"{args.turns} turns, pool={args.pool} concurrency={args.concurrency}; "
            f"redis {redis_url}, db {db_url.rsplit('/', 1)[-1]}",
            flush=True,
        )
        t0 = time.monotonic()
        wait_ready(client.celery, chorus_worker)
        wait_ready(tasks.app, raw_worker)
        print(f"workers ready in {time.monotonic() - t0:.1f}s", flush=True)

        job_ids: list[str] = []
        sides = [
            Side(
                "chorus",
                chorus_turn(
                    client,
                    agent,
                    job_input(args.steps, tasks.TOOLS_PER_STEP),
                    expected_answer(args.steps),
                    args.turn_timeout,
                    job_ids,
                ),
                chorus_worker,
            ),
            Side(
                "raw celery", raw_turn(tasks, raw_prefix, args.steps, args.turn_timeout), raw_worker
            ),
            Side(
                RAW_MODEL,
                raw_model_turn(
                    tasks, raw_prefix, model, model_settings, args.steps, args.turn_timeout
                ),
                raw_worker,
            ),
        ]
        if traced is not None:
            text = job_input(args.steps, tasks.TOOLS_PER_STEP)
            expected = expected_answer(args.steps)
            sides.append(traced.side(agent, text, expected, args.turn_timeout, stack))
        for side in sides:
            ms = side.timed(args.steps)
            print(f"warm-up  {side.name:<11} {ms:8.2f} ms/step (excluded)", flush=True)
            side.reset()
        job_ids.clear()
        start_profiling(args, profile_dirs)
        with py_spy(args.py_spy, [chorus_worker, raw_worker], workdir) as samples:
            for turn in range(args.turns):
                for side in sides:
                    ms = side.timed(args.steps)
                    print(f"turn {turn + 1:<3} {side.name:<11} {ms:8.2f} ms/step", flush=True)
        report(sides, args.steps)
        if traced is not None:
            traced.report(sides[0], sides[-1], args.steps)
        chorus_phases(client, job_ids)
        for name, path in samples.items():
            print_py_spy(f"{name} worker", path, args.turns * args.steps, args.profile_top)

        if args.profile or args.task_cpu:
            stack.close()  # stop the workers now so that they write their profiles
            print_profiles(args, profile_dirs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
