"""Per-step overhead of Chorus, against raw Celery running the same canvas.

What is measured
----------------
(a) **Chorus**: the agent ``bench-step-overhead`` (``bench/step_overhead_tasks.py``)
    has a scripted model, reached through litellm like any provider
    (``orchestrator.llm.scripted``), that asks for 4 parallelizable no-op
    tool calls per step for ``--steps`` steps, then answers with text. Each
    timed turn is ``Client.submit(...).result()`` seen from this process:
    the turn's wall time divided by ``--steps``. A turn is ``--steps`` steps
    of ``chorus.step`` → ``chord(group(4 x chorus.tool), chorus.advance)``,
    plus the closing ``chorus.step`` whose model answers (its cost is spread
    over the steps, the same way on both sides).
(b) **raw Celery**: the same shape with nothing but Celery:
    ``bench.step`` → ``chord(group(4 x bench.tool), bench.advance)`` →
    ``bench.step`` … for the same number of steps, then a closing
    ``bench.step`` that pushes to a Redis list the client waits on (BLPOP).
    Same configuration (:func:`orchestrator.celery_conf.celery_config`: JSON,
    acks late, prefetch 1, task events), its own Redis prefix, and a worker
    with the same pool, concurrency and queues.
(c) the ratio chorus / raw of the median per-step times.

Both workers are real processes started here (``chorus worker`` and
``celery -A bench.step_overhead_tasks worker``, both ``-Q llm,control,tools``
with ``--pool``/``--concurrency``), cwd the repo root and ``PYTHONPATH`` set
to it. Redis is ``CHORUS_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``),
with fresh key prefixes deleted at the end. Postgres is
``CHORUS_DATABASE_URL`` if set; otherwise a database
``chorus_bench_<random>`` is created on ``--admin-url``, migrated, and
dropped at the end. One warm-up turn per side is excluded from timing
(litellm's lazy imports, first connections); then the timed turns of the
two sides alternate, so drift on the machine hits both alike. Each Chorus
turn is a new conversation (history grows within a turn, as in real use).

``--profile`` additionally runs cProfile around every task of both workers
(after the warm-up) and prints where the time goes per step.

Run from the repo root::

    .venv/bin/python bench/step_overhead.py
    .venv/bin/python bench/step_overhead.py --steps 20 --turns 5 --pool threads -c 8 --profile
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(REPO))

TASKS_MODULE = "bench.step_overhead_tasks"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
DEFAULT_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=20, help="tool steps per turn (default 20)")
    p.add_argument("--turns", type=int, default=3, help="timed turns per side (default 3)")
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
    p.add_argument("--keep-logs", action="store_true", help="print where worker logs are")
    args = p.parse_args(argv)
    if args.steps < 1 or args.steps > 998:
        p.error("--steps must be between 1 and 998 (the agent's max_steps is 1000)")
    if args.turns < 1:
        p.error("--turns must be at least 1")
    return args


# --- services -------------------------------------------------------------


@contextmanager
def database(admin_url: str, run_id: str) -> Iterator[str]:
    """``CHORUS_DATABASE_URL`` as is, or a fresh database dropped afterwards."""
    given = os.environ.get("CHORUS_DATABASE_URL")
    if given:
        yield given
        return
    import psycopg

    name = f"chorus_bench_{run_id}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(admin_url)
    url = urlunsplit(parts._replace(scheme="postgresql+psycopg", path=f"/{name}"))
    try:
        yield url
    finally:
        from orchestrator.store.db import get_engine

        if get_engine.cache_info().currsize:
            get_engine(url).dispose()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def purge_redis(url: str, prefixes: list[str]) -> None:
    """Delete every key of this run's prefixes."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        for prefix in prefixes:
            batch: list[bytes] = []
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    client.delete(*batch)
                    batch.clear()
            if batch:
                client.delete(*batch)
    finally:
        client.close()


@dataclass
class Worker:
    """A worker subprocess in its own process group, logging to a file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.name} worker exited with {self.proc.returncode}; "
                f"log tail:\n{tail(self.log_path)}"
            )


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextmanager
def worker_process(name: str, cmd: list[str], env: dict[str, str], log: Path) -> Iterator[Worker]:
    """Start ``cmd``; on exit TERM its process group, KILL it if it lingers."""
    handle: IO[bytes] = log.open("wb")
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield Worker(name, proc, log)
    finally:
        _stop(proc)
        handle.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # the group may outlive its leader (prefork children): make sure it is gone
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def wait_ready(app: Any, worker: Worker, timeout: float = 180.0) -> None:
    """Until the worker answers a control ping (it imported litellm and connected)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        worker.check()
        if app.control.ping(timeout=0.5):
            return
    raise RuntimeError(
        f"{worker.name} worker not ready after {timeout:.0f}s:\n{tail(worker.log_path)}"
    )


# --- the two sides --------------------------------------------------------


@dataclass
class Side:
    """One side of the comparison: how to run a turn, and its timings."""

    name: str
    run_turn: Callable[[], None]
    worker: Worker
    seconds: list[float] = field(default_factory=list)

    def timed(self, steps: int) -> float:
        self.worker.check()
        start = time.perf_counter()
        self.run_turn()
        elapsed = time.perf_counter() - start
        self.seconds.append(elapsed)
        return elapsed * 1000 / steps


def chorus_turn(client: Any, agent: str, steps: int, timeout: float) -> Callable[[], None]:
    expected = f"done after {steps} steps"

    def run() -> None:
        output = client.submit(agent, f"steps={steps}").result(timeout=timeout)
        if output != expected:
            raise RuntimeError(f"chorus turn answered {output!r}, expected {expected!r}")

    return run


def raw_turn(tasks: Any, prefix: str, steps: int, timeout: float) -> Callable[[], None]:
    import redis

    client = redis.Redis.from_url(tasks.app.conf.broker_url)

    def run() -> None:
        run_id = uuid.uuid4().hex
        tasks.raw_step.apply_async((run_id, 0, steps))
        if client.blpop([tasks.done_key(prefix, run_id)], timeout=int(timeout)) is None:
            raise TimeoutError(f"raw turn {run_id} did not finish within {timeout:.0f}s")

    return run


# --- reporting ------------------------------------------------------------


def report(sides: list[Side], steps: int) -> None:
    per_step = {s.name: [t * 1000 / steps for t in s.seconds] for s in sides}
    print()
    print(f"{'':<12} {'turns':>5} {'steps':>5} {'median ms/step':>15} {'min':>8} {'max':>8}")
    for name, values in per_step.items():
        print(
            f"{name:<12} {len(values):>5} {steps:>5} {statistics.median(values):>15.2f} "
            f"{min(values):>8.2f} {max(values):>8.2f}"
        )
    chorus, raw = (statistics.median(v) for v in per_step.values())
    print(f"{'ratio':<12} {'':>5} {'':>5} {chorus / raw:>15.2f}   (chorus / raw)")


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


# --- main -----------------------------------------------------------------


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
    run_id = secrets.token_hex(4)
    redis_url = os.environ.get("CHORUS_REDIS_URL") or DEFAULT_REDIS
    chorus_prefix, raw_prefix = f"chorus-bench-{run_id}", f"chorus-bench-raw-{run_id}"
    bindir = Path(sys.executable).parent
    workdir = Path(tempfile.mkdtemp(prefix=f"chorus-bench-{run_id}-"))

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
        os.environ.update(env_vars)  # this process is the client of both sides
        base_env = {k: v for k, v in os.environ.items() if k != "BENCH_PROFILE"}
        base_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        )
        profile_dirs = {name: workdir / f"profile-{name}" for name in ("chorus", "raw")}

        def env_for(name: str) -> dict[str, str]:
            env = dict(base_env)
            if args.profile:
                profile_dirs[name].mkdir()
                env["BENCH_PROFILE"] = str(profile_dirs[name])
                env["BENCH_PROFILE_TIMER"] = args.profile_timer
            return env

        from orchestrator.store.migrate import upgrade

        upgrade(db_url)
        pool = ["-Q", "llm,control,tools", "-P", args.pool, "-c", str(args.concurrency)]
        chorus_worker = stack.enter_context(
            worker_process(
                "chorus",
                [
                    str(bindir / "chorus"),
                    "worker",
                    *pool,
                    "-l",
                    args.loglevel,
                    "-n",
                    f"bench-chorus-{run_id}@%h",
                ],
                env_for("chorus"),
                workdir / "chorus-worker.log",
            )
        )
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
        from orchestrator import Client
        from orchestrator.settings import load_settings

        client = Client(load_settings())
        stack.callback(client.close)
        print(
            f"chorus vs raw Celery: {args.steps} steps x {tasks.TOOLS_PER_STEP} no-op tools, "
            f"{args.turns} turns, pool={args.pool} concurrency={args.concurrency}; "
            f"redis {redis_url}, db {db_url.rsplit('/', 1)[-1]}",
            flush=True,
        )
        t0 = time.monotonic()
        wait_ready(client.celery, chorus_worker)
        wait_ready(tasks.app, raw_worker)
        print(f"workers ready in {time.monotonic() - t0:.1f}s", flush=True)

        sides = [
            Side(
                "chorus",
                chorus_turn(client, tasks.AGENT, args.steps, args.turn_timeout),
                chorus_worker,
            ),
            Side(
                "raw celery", raw_turn(tasks, raw_prefix, args.steps, args.turn_timeout), raw_worker
            ),
        ]
        for side in sides:
            ms = side.timed(args.steps)
            print(f"warm-up  {side.name:<11} {ms:8.2f} ms/step (excluded)", flush=True)
            side.seconds.clear()
        if args.profile:
            for directory in profile_dirs.values():
                (directory / "on").touch()
        for turn in range(args.turns):
            for side in sides:
                ms = side.timed(args.steps)
                print(f"turn {turn + 1:<3} {side.name:<11} {ms:8.2f} ms/step", flush=True)
        report(sides, args.steps)

        if args.profile:
            # stop the workers now so that they write their profiles
            stack.close()
            steps_profiled = args.turns * args.steps
            print_profile("chorus worker", profile_dirs["chorus"], steps_profiled, args.profile_top)
            print_profile("raw worker", profile_dirs["raw"], steps_profiled, args.profile_top)
    if args.keep_logs:
        print(f"worker logs and profiles in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
