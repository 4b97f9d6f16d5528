"""Step CPU as the history grows: step 0 against step 50 of one turn.

What is measured
----------------
The agent ``bench-history`` (``bench/history_tasks.py``) has a scripted
model, reached through litellm like any provider
(``orchestrator.llm.scripted``), that calls one tool per step for
``--steps`` steps (default 51: steps 0 to 50), each call returning 20 KB of
text, then answers. So at step ``s`` the model's request carries ``s`` tool
results: about ``20 * s`` KB of history.

One real ``chorus worker`` (``-Q llm,control,tools``) runs the turns, one
turn at a time. Around every task the worker records the CPU time of the
thread that ran it and of its whole process (``task_prerun`` →
``task_postrun``; see ``bench/history_tasks.py``). A tool step ``s`` is its
``chorus.step`` task (history load, model call, persisting the reply and
the tool call), the tool's ``chorus.tool`` task and the
``chorus.advance`` that stores the result and sends step ``s + 1``: tasks
run one after the other, so each ``chorus.tool`` / ``chorus.advance`` is
counted in the step whose ``chorus.step`` ran last before it. The figures
are medians over ``--turns`` timed turns (a warm-up turn is excluded).

Printed: CPU ms of step 0 and step ``--at`` (default 50), thread CPU (the
tasks' own threads) and process CPU (every thread of the worker while a
task ran), for the ``chorus.step`` task alone and for the whole step, with
the ratio against the 1.2x target, plus a row every 10 steps; and a
least-squares line through every step of every turn (``fit``: ms at step
0 + ms more per 10 steps; ``fit x``: the line's step ``--at`` / step 0),
less noisy than two single steps on a busy machine.

Redis is ``CHORUS_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``), with
a fresh key prefix deleted at the end; Postgres is ``CHORUS_DATABASE_URL``
if set, else a fresh database on ``--admin-url`` dropped at the end.

``--profile``: cProfile (per-thread CPU) around the ``chorus.step`` tasks
of step 0 and step ``--at`` of the timed turns; printed: the functions
whose time grew most from step 0 to step ``--at`` (what still costs in
proportion to the history), ms per step. cProfile slows the steps it
profiles (2-3x): with ``--profile`` the CPU table's step 0 and step ``--at``
are not comparable with the other rows.

Run from the repo root::

    .venv/bin/python bench/history.py
    .venv/bin/python bench/history.py --turns 5 --steps 51 --profile
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import sys
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(REPO))

from bench._harness import (  # noqa: E402
    DEFAULT_ADMIN,
    bench_main,
    chorus_worker_cmd,
    client_services,
    raise_exit,
    wait_ready,
    worker_env,
    worker_process,
)

TASKS_MODULE = "bench.history_tasks"
TARGET = 1.2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=51, help="tool steps per turn (default 51)")
    p.add_argument("--at", type=int, default=50, help="step compared with step 0 (default 50)")
    p.add_argument("--turns", type=int, default=3, help="timed turns (default 3)")
    p.add_argument("--pool", default="threads", help="worker pool")
    p.add_argument("--concurrency", "-c", type=int, default=4, help="worker concurrency")
    p.add_argument("--admin-url", default=DEFAULT_ADMIN, help="Postgres to create the DB on")
    p.add_argument("--turn-timeout", type=float, default=600.0, help="seconds per turn")
    p.add_argument("--loglevel", default="WARNING", help="worker log level")
    p.add_argument("--profile", action="store_true", help="cProfile every task after warm-up")
    p.add_argument("--profile-top", type=int, default=30, help="rows of each profile table")
    p.add_argument("--keep-logs", action="store_true", help="print where worker logs are")
    args = p.parse_args(argv)
    if not 1 <= args.steps <= 200:
        p.error("--steps must be between 1 and 200")
    if not 0 <= args.at < args.steps:
        p.error("--at must be a tool step: 0 <= --at < --steps")
    if args.turns < 1:
        p.error("--turns must be at least 1")
    return args


# --- per-step CPU from the worker's per-task records -------------------------

#: CPU ms of one step: (chorus.step alone, the whole step) x (thread, process).
StepCpu = dict[str, float]


def steps_cpu(records: list[dict[str, Any]]) -> dict[str, dict[int, StepCpu]]:
    """Per turn, per step: CPU ms of its tasks (see the module docstring)."""
    turns: dict[str, dict[int, StepCpu]] = defaultdict(dict)
    current: StepCpu | None = None
    for record in sorted(records, key=lambda r: r["start"]):
        kind, _, rest = str(record["task_id"]).partition(":")
        if kind == "step":
            _conversation, turn_id, step = rest.split(":")
            current = turns[turn_id].setdefault(
                int(step),
                {"step thread": 0.0, "step process": 0.0, "all thread": 0.0, "all process": 0.0},
            )
            current["step thread"] += record["thread_cpu"] * 1000
            current["step process"] += record["process_cpu"] * 1000
        if current is not None:
            current["all thread"] += record["thread_cpu"] * 1000
            current["all process"] += record["process_cpu"] * 1000
    return turns


def report(turns: list[dict[int, StepCpu]], at: int, steps: int) -> None:
    print(f"\nworker CPU ms per step, median of {len(turns)} turns (20 KB tool output a step)")
    columns = ("step thread", "step process", "all thread", "all process")
    print(f"{'step':>6} " + " ".join(f"{c:>13}" for c in columns))

    def median(step: int, column: str) -> float:
        return statistics.median(t[step][column] for t in turns if step in t)

    shown = sorted({0, at, *range(10, steps, 10)})
    for step in shown:
        print(f"{step:>6} " + " ".join(f"{median(step, c):>13.1f}" for c in columns))
    print(f"{'ratio':>6} " + " ".join(f"{median(at, c) / median(0, c):>12.2f}x" for c in columns))
    fits = [_fit(turns, c, at) for c in columns]
    print(f"{'fit':>6} " + " ".join(f"{f'{a:.1f}+{b * 10:.2f}/10':>13}" for a, b, _ in fits))
    print(f"{'fit x':>6} " + " ".join(f"{ratio:>12.2f}x" for _, _, ratio in fits))
    print(f"(target: step {at} <= {TARGET}x step 0; 'step' = the chorus.step task alone,")
    print(" 'all' = chorus.step + chorus.tool + chorus.advance; 'thread' = the tasks'")
    print(" own threads, 'process' = every thread of the worker while a task ran)")


def _fit(turns: list[dict[int, StepCpu]], column: str, at: int) -> tuple[float, float, float]:
    """A least-squares line through steps 0 to ``at`` of every turn: (ms at step 0,
    ms more per step, the line's step ``at`` / step 0): less noisy than two
    single steps."""
    points = [(step, cpu[column]) for t in turns for step, cpu in t.items() if step <= at]
    slope, intercept = statistics.linear_regression(*zip(*points, strict=True))
    return intercept, slope, (intercept + slope * at) / intercept


# --- main ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    return bench_main(parse_args(argv), run, "chorus-bench-history-")


def run(args: argparse.Namespace, workdir: Path) -> int:
    """Start the services and a worker, run the turns, print the figures."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_exit)
    run_id = secrets.token_hex(4)
    prefix = f"chorus-bench-history-{run_id}"
    profile_dir = workdir / "profile"

    with ExitStack() as stack:
        redis_url, db_url = client_services(stack, args.admin_url, run_id, prefix, TASKS_MODULE)
        env = worker_env()
        if args.profile:
            profile_dir.mkdir()
            env["BENCH_HISTORY_PROFILE"] = str(profile_dir)
            env["BENCH_HISTORY_PROFILE_STEPS"] = f"0,{args.at}"

        from orchestrator.store.migrate import upgrade

        upgrade(db_url)
        cmd = chorus_worker_cmd(
            f"bench-history-{run_id}", args.pool, args.concurrency, args.loglevel
        )
        worker = stack.enter_context(worker_process("chorus", cmd, env, workdir / "worker.log"))

        import redis

        import bench.history_tasks as tasks
        from orchestrator import Client
        from orchestrator.settings import load_settings

        client = Client(load_settings())
        stack.callback(client.close)
        store = redis.Redis.from_url(redis_url)
        stack.callback(store.close)
        print(
            f"history growth: {args.steps} tool steps x {tasks.BLOB_BYTES} B tool output, "
            f"{args.turns} turns, pool={args.pool} concurrency={args.concurrency}; "
            f"redis {redis_url}, db {db_url.rsplit('/', 1)[-1]}; "
            f"1-min load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        t0 = time.monotonic()
        wait_ready(client.celery, worker)
        print(f"worker ready in {time.monotonic() - t0:.1f}s", flush=True)

        def turn(steps: int) -> str:
            worker.check()
            began = time.perf_counter()
            job = client.submit(tasks.AGENT, f"steps={steps}")
            output = job.result(timeout=args.turn_timeout)
            if output != f"done after {steps} steps":
                raise RuntimeError(f"turn {job.id} answered {output!r}")
            print(f"  turn {job.id}: {time.perf_counter() - began:.1f} s", flush=True)
            return job.id

        turn(min(args.steps, 3))  # warm-up: imports, connections, first calls
        if args.profile:
            (profile_dir / "on").touch()
        timed = [turn(args.steps) for _ in range(args.turns)]
        time.sleep(0.5)  # the last tasks' postrun records
        records = [json.loads(r) for r in store.lrange(tasks.cpu_key(prefix), 0, -1)]
        per_turn = steps_cpu(records)
        report([per_turn[job_id] for job_id in timed], args.at, args.steps)

        if args.profile:
            stack.close()  # stop the worker so that it writes its profiles
            print_growth(profile_dir, args.at, args.turns, args.profile_top)
    return 0


def print_growth(directory: Path, at: int, turns: int, top: int) -> None:
    """The functions of ``chorus.step`` whose CPU grew most from step 0 to step ``at``."""
    import pstats

    def load(step: int) -> dict[tuple[str, int, str], tuple[float, float, float]]:
        path = directory / f"step-{step}.pstats"
        if not path.exists():
            raise RuntimeError(f"no profile of step {step} (worker did not shut down cleanly?)")
        raw: dict[Any, Any] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
        return {
            f: (nc / turns, tt * 1000 / turns, ct * 1000 / turns)
            for f, (_, nc, tt, ct, _) in raw.items()
        }

    first, last = load(0), load(at)
    rows = []
    for func, (calls, own, cumulative) in last.items():
        calls0, own0, cumulative0 = first.get(func, (0.0, 0.0, 0.0))
        rows.append((cumulative - cumulative0, own - own0, calls - calls0, cumulative0, func))
    print(f"\nchorus.step profile (thread CPU, cProfile), step 0 -> step {at}, ms per step")
    for heading, key in (("own time", 1), ("cumulative", 0)):
        print(f"  -- top {top} by growth of {heading}")
        print(f"  {'cum@0':>8} {'+cum':>8} {'+own':>8} {'+calls':>8}  function")
        for row in sorted(rows, key=lambda r: r[key], reverse=True)[:top]:
            filename, line, name = row[4]
            where = filename.split("site-packages/")[-1].replace(str(REPO) + "/", "")
            figures = f"{row[3]:>8.2f} {row[0]:>8.2f} {row[1]:>8.2f} {row[2]:>8.1f}"
            print(f"  {figures}  {where}:{line}({name})")


if __name__ == "__main__":
    sys.exit(main())
