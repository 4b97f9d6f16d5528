"""The HTTP API against the Python client: submits/s, event latency and
memory per follower, the same work done both ways on one fleet.

What is measured
----------------
A fleet (one ``chorus worker`` process, every queue, a threads pool) runs
the agent ``bench-api`` (``bench/api_tasks.py``): one tool call that
sleeps ``--pause`` seconds, then an answer; about a dozen events a turn.

* **followers alone**: ``--followers`` jobs are submitted and each is
  followed at once to its end: over HTTP, one SSE stream each from one
  asyncio loop (``httpx.AsyncClient``); with the client, one thread each
  iterating ``Job.events()``. **Memory per follower** is the growth of the
  serving process's RSS (the ``chorus server`` process over HTTP, this
  process with the client) from before the followers connect to its peak
  while they follow, divided by their number.
* **followers and submitters at once**: as many new followers again, and
  while they follow, ``--submits`` jobs submitted by ``--submitters``
  threads, over HTTP (``POST /v1/jobs``, one ``httpx.Client`` a thread, to
  a ``chorus server`` process) and with ``Client.submit`` (one client
  shared by the threads): **submits/s** under that load.
* **Event latency** (both phases) is the time an event is delivered minus
  its stored ``time`` (when its transaction wrote it), over the events
  stored after the follower connected (replayed ones are not live; over
  HTTP, after the stream's headers came), median and p95. ``tool.started``
  is left out: it is stored with its tool's result and carries the claim's
  time, so its "latency" would be the tool's run time.

Redis is ``CHORUS_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``)
under a fresh key prefix, Postgres ``CHORUS_DATABASE_URL`` or a fresh
database on ``--admin-url``; both removed at the end.

Run from the repo root::

    .venv/bin/python bench/api.py
    .venv/bin/python bench/api.py --followers 200 --submits 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime
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
    peak_rss,
    wait_ready,
    worker_env,
    worker_process,
)

#: Stored with its tool's result but carrying the claim's time (a tool's
#: start is not a write of its own): its "latency" is the tool's run time.
_CLAIM_TIMED = "tool.started"


def _latency(event: dict[str, Any], since: float) -> float | None:
    if event["name"] == _CLAIM_TIMED:
        return None
    stored = datetime.fromisoformat(event["time"]).timestamp()
    return time.time() - stored if stored >= since else None


def _percentiles(latencies: list[float]) -> tuple[float, float, int]:
    """Median and p95 in ms, and how many."""
    ordered = sorted(latencies)
    return (
        statistics.median(ordered) * 1000,
        ordered[int(len(ordered) * 0.95)] * 1000,
        len(ordered),
    )


def timed_submits(
    submit: Callable[[int], str], count: int, threads: int
) -> tuple[float, list[str]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        ids = list(pool.map(submit, range(count)))
    return count / (time.perf_counter() - start), ids


async def _follow_http(url: str, token: str, job_ids: list[str]) -> list[float]:
    import httpx

    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=len(job_ids) + 10)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as http:

        async def one(job_id: str) -> None:
            async with http.stream("GET", f"/v1/jobs/{job_id}/events") as answer:
                since = time.time()  # the stream is open: what is stored now is live
                async for line in answer.aiter_lines():
                    if line.startswith("data: {") and '"seq"' in line:
                        found = _latency(json.loads(line[6:]), since)
                        if found is not None:
                            latencies.append(found)

        await asyncio.gather(*(one(j) for j in job_ids))
    return latencies


def _follow_client(client: Any, job_ids: list[str]) -> list[float]:
    latencies: list[float] = []

    def one(job_id: str) -> None:
        since = time.time()
        for event in client.job(job_id).events(deltas=False):
            found = _latency({"name": event.name, "time": event.time.isoformat()}, since)
            if found is not None:
                latencies.append(found)

    with ThreadPoolExecutor(len(job_ids)) as pool:
        list(pool.map(one, job_ids))
    return latencies


def _wait_all(client: Any, job_ids: list[str]) -> None:
    for job_id in job_ids:
        client.job(job_id).result(timeout=600)


def _server(stack: ExitStack, workdir: Path) -> tuple[str, int]:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    command = [str(Path(sys.executable).parent / "chorus"), "server", "--port", str(port)]
    proc = stack.enter_context(
        worker_process("server", [*command, "-l", "warning"], worker_env(), workdir / "server.log")
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        proc.check()
        try:
            if httpx.get(f"{url}/v1/ready", timeout=1).status_code == 200:
                return url, proc.proc.pid
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("chorus server did not start")


def run(args: argparse.Namespace, workdir: Path) -> int:
    import httpx

    run_id = secrets.token_hex(4)
    with ExitStack() as stack:
        _, db_url = client_services(
            stack,
            args.admin_url,
            run_id,
            f"bench-api-{run_id}",
            "bench.api_tasks",
            CHORUS_BENCH_API_PAUSE=str(args.pause),
        )
        from orchestrator import Client
        from orchestrator.store import token_sql
        from orchestrator.store.migrate import upgrade

        upgrade(db_url)
        client = Client()
        stack.callback(client.close)
        cmd = chorus_worker_cmd("bench-api", "threads", args.concurrency, "WARNING")
        worker = stack.enter_context(worker_process("fleet", cmd, worker_env(), workdir / "w.log"))
        wait_ready(client.celery, worker)
        with client.runtime.session() as session:
            _, token = token_sql.create(session, "bench", token_sql.Scope.SUBMIT, "bench")
        url, server_pid = _server(stack, workdir)
        local = threading.local()

        def http_submit(i: int) -> str:
            if not hasattr(local, "http"):
                local.http = httpx.Client(
                    base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
                )
            body = {"agent": "bench-api", "input": f"job {i}"}
            return str(local.http.post("/v1/jobs", json=body).json()["job_id"])

        def client_submit(i: int) -> str:
            return client.submit("bench-api", f"job {i}").id

        rows = []
        for label, submit, pid in (
            ("HTTP API", http_submit, server_pid),
            ("Python client", client_submit, os.getpid()),
        ):

            def follow(job_ids: list[str], side: str = label) -> list[float]:
                if side == "HTTP API":
                    return asyncio.run(_follow_http(url, token, job_ids))
                return _follow_client(client, job_ids)

            alone = [submit(i) for i in range(args.followers)]
            with peak_rss(pid) as memory:
                quiet = follow(alone)
            _wait_all(client, alone)
            # followers and submitters at once: the rate while followed, the
            # latency while submitted to
            loaded = [submit(i) for i in range(args.followers)]
            with ThreadPoolExecutor(1) as background:
                submitting = background.submit(timed_submits, submit, args.submits, args.submitters)
                busy = follow(loaded)
                rate, ids = submitting.result()
            _wait_all(client, loaded + ids)
            kb = (memory["peak"] - memory["before"]) * 1024 / args.followers
            rows.append((label, rate, _percentiles(busy), _percentiles(quiet), kb))
    print(
        f"{args.submits} submits from {args.submitters} threads while {args.followers} "
        f"followers follow a {args.pause:g} s turn each (then the followers alone); "
        f"1-min load {os.getloadavg()[0]:.1f}"
    )
    head = (
        f"{'submits/s':>10} {'latency p50':>12} {'p95':>8} {'events':>7}"
        f" {'alone: p50':>11} {'p95':>8} {'KB/follower':>12}"
    )
    print(f"{'':<14} {head}")
    for label, rate, (p50, p95, count), (q50, q95, _), kb in rows:
        print(
            f"{label:<14} {rate:>10.1f} {p50:>9.1f} ms {p95:>5.1f} ms {count:>7}"
            f" {q50:>8.1f} ms {q95:>5.1f} ms {kb:>12.0f}"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--followers", type=int, default=100)
    parser.add_argument("--submits", type=int, default=200)
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--pause", type=float, default=2.0, help="Seconds the tool sleeps.")
    parser.add_argument("--concurrency", type=int, default=32, help="Threads of the worker.")
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN)
    parser.add_argument("--keep-logs", action="store_true")
    return bench_main(parser.parse_args(), run, "chorus-bench-api-")


if __name__ == "__main__":
    sys.exit(main())
