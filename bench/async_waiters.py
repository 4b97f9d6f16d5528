"""Ten thousand ``await job.result()`` on one AsyncClient, on one event loop.

What is measured
----------------
One :class:`~orchestrator.AsyncClient` (one process, one event loop)
submits ``--jobs`` jobs of the agent ``bench-waited``
(``bench/async_waiters_tasks.py``: a tool sleeping ``--nap`` seconds, then
an answer), then starts ``--waiters`` coroutines, each awaiting
``result()`` of one job (round robin), all at once. Reported: the time
from starting the waiters to the last answer (and from the first submit),
whether every answer is right, the client's CPU seconds, and the most
Postgres and Redis connections the client held meanwhile, as the servers
count them (``pg_stat_activity`` and ``CLIENT LIST`` rows carrying the
client's name, sampled every half second: :meth:`AsyncClient.connections`),
and the client process's memory: its RSS just before the waiters start and
its peak while they wait (sampled every 50 ms), the growth divided by the
waiters.
The client imports no agent module: it validates ``bench-waited`` against
what the workers published.

Workers are real processes started here: ``--workers`` copies of ``chorus
worker -Q llm,control,tools -P threads -c <concurrency>``. Redis is
``CHORUS_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) under a fresh
key prefix deleted at the end; Postgres is ``CHORUS_DATABASE_URL`` if set,
otherwise a database created on ``--admin-url``, migrated, and dropped.

    .venv/bin/python bench/async_waiters.py [--waiters 10000] [--jobs 200]
    .venv/bin/python bench/async_waiters.py --waiters 1000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import socket
import sys
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(REPO))

from bench._harness import (  # noqa: E402
    DEFAULT_ADMIN,
    bench_main,
    chorus_worker_cmd,
    client_services,
    peak_rss,
    raise_exit,
    self_cpu_seconds,
    wait_ready,
    worker_env,
    worker_process,
)

TASKS_MODULE = "bench.async_waiters_tasks"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiters", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--nap", type=float, default=3.0, help="seconds each job's tool sleeps")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pool-size", type=int, default=5, help="the client's db_pool_size")
    parser.add_argument("--pool-overflow", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN)
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--keep-logs", action="store_true")
    return parser.parse_args(argv)


async def measure(args: argparse.Namespace) -> dict[str, float]:
    from orchestrator import AsyncClient
    from orchestrator.settings import load_settings

    settings = load_settings().model_copy(
        update={
            "modules": [],  # the client imports no agent module
            "db_pool_size": args.pool_size,
            "db_pool_overflow": args.pool_overflow,
        }
    )
    peak = {"postgres": 0, "redis": 0}
    async with AsyncClient(settings) as client:
        started = time.monotonic()
        jobs = [await client.submit("bench-waited", f"job {i}") for i in range(args.jobs)]
        submitted = time.monotonic()
        cpu = self_cpu_seconds()
        with peak_rss(os.getpid()) as memory:
            waits = [
                asyncio.ensure_future(jobs[n % len(jobs)].result(timeout=args.timeout))
                for n in range(args.waiters)
            ]
            done = asyncio.ensure_future(asyncio.gather(*waits))
            while not done.done():
                held = await client.connections()
                for kind in peak:
                    peak[kind] = max(peak[kind], held[kind])
                await asyncio.wait([done], timeout=0.5)
            answers = done.result()
            ended = time.monotonic()
        cpu = self_cpu_seconds() - cpu
    wrong = sum(a != f"done job {n % len(jobs)}" for n, a in enumerate(answers))
    return {
        "submit_s": submitted - started,
        "wait_s": ended - submitted,
        "total_s": ended - started,
        "cpu_s": cpu,
        "wrong": wrong,
        "rss_before_mb": memory["before"],
        "rss_peak_mb": memory["peak"],
        **{f"peak_{k}": v for k, v in peak.items()},
    }


def run(args: argparse.Namespace, workdir: Path) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_exit)
    run_id = secrets.token_hex(4)
    prefix = f"chorus-bench-waiters-{run_id}"
    with ExitStack() as stack:
        redis_url, db_url = client_services(
            stack,
            args.admin_url,
            run_id,
            prefix,
            TASKS_MODULE,
            CHORUS_BENCH_NAP=str(args.nap),
            CHORUS_DB_POOL_SIZE="4",
            CHORUS_DB_POOL_OVERFLOW="6",
        )
        from orchestrator.store.migrate import upgrade

        upgrade(db_url)
        env = worker_env()
        host = socket.gethostname()
        from orchestrator.celery_conf import make_celery
        from orchestrator.settings import load_settings

        app = make_celery(load_settings(), main="bench")
        for i in range(args.workers):
            node = f"bench-waiters-{run_id}-{i}"
            cmd = chorus_worker_cmd(node, "threads", args.concurrency, args.loglevel)
            worker = stack.enter_context(
                worker_process(f"worker{i}", cmd, env, workdir / f"worker{i}.log")
            )
            wait_ready(app, worker, node=f"{node}@{host}")
        app.close()
        print(
            f"{args.waiters} result() awaits on {args.jobs} jobs (tool naps {args.nap} s), "
            f"one AsyncClient (pool {args.pool_size}+{args.pool_overflow}); "
            f"{args.workers} worker(s) x threads -c {args.concurrency}; redis {redis_url}, "
            f"db {db_url.rsplit('/', 1)[-1]}; 1-min load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        figures = asyncio.run(measure(args))
    print(f"submit {args.jobs} jobs           {figures['submit_s']:8.2f} s")
    print(f"all {args.waiters} answered after  {figures['wait_s']:8.2f} s (from the last submit)")
    print(f"from the first submit          {figures['total_s']:8.2f} s")
    print(f"client CPU while waiting       {figures['cpu_s']:8.2f} s")
    print(f"wrong answers                  {int(figures['wrong']):8d}")
    print(f"Postgres connections held, max {int(figures['peak_postgres']):8d} (pg_stat_activity)")
    print(f"Redis connections held, max    {int(figures['peak_redis']):8d} (CLIENT LIST)")
    grown = figures["rss_peak_mb"] - figures["rss_before_mb"]
    print(
        f"client RSS                     {figures['rss_before_mb']:8.1f} MB before the waiters, "
        f"peak {figures['rss_peak_mb']:.1f} MB (+{grown:.1f} MB, "
        f"{grown * 1024 / args.waiters:.1f} KB a waiter)"
    )
    return 1 if figures["wrong"] else 0


def main(argv: list[str] | None = None) -> int:
    return bench_main(parse_args(argv), run, "chorus-bench-waiters-")


if __name__ == "__main__":
    raise SystemExit(main())
