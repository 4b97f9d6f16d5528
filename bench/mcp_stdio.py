"""Job wall time of twelve parallel calls to a stdio MCP server.

What is measured
----------------
One turn of each agent of ``bench/mcp_stdio_tasks.py``: a scripted model
asks for twelve parallel ``get_current_time`` calls of the reference
server ``mcp-server-time`` (PyPI; ``pip install mcp-server-time``) in one
reply, then answers. ``bench-mcp-session`` calls it as an ``MCPServer``
(Chorus keeps one server process per worker process: a call is a message
on its session); ``bench-mcp-spawn`` calls it through a plain tool that
starts a server process for each call and closes it after (what every
stdio call cost before servers were kept: the "before" figure). The
turns run through one real ``chorus worker`` (``-Q llm,control,tools -P
threads -c 16``: the twelve calls run at once) against Redis and Postgres.

Printed per turn: the **job wall time** (``Client.submit`` to its result,
seen from this process) and the **tool batch** (first ``tool.started`` to
last ``tool.completed`` of the turn's events). The first session turn is
the cold one (its worker process starts the server); the ones after reuse
it. ``--turns`` turns of each side alternate, so drift hits both alike.

Redis is ``CHORUS_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) under
a fresh key prefix deleted at the end; Postgres is ``CHORUS_DATABASE_URL``
if set, otherwise a database ``chorus_bench_<random>`` created on
``--admin-url``, migrated, and dropped at the end.

Run from the repo root::

    .venv/bin/python bench/mcp_stdio.py
    .venv/bin/python bench/mcp_stdio.py --turns 5
"""

from __future__ import annotations

import argparse
import importlib.util
import secrets
import signal
import statistics
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
    raise_exit,
    wait_ready,
    worker_env,
    worker_process,
)

TASKS_MODULE = "bench.mcp_stdio_tasks"
SIDES = {"spawn (a process per call)": "bench-mcp-spawn", "session (kept)": "bench-mcp-session"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--turns", type=int, default=3, help="turns of each side (default 3)")
    p.add_argument("--admin-url", default=DEFAULT_ADMIN, help="Postgres to create the DB on")
    p.add_argument("--turn-timeout", type=float, default=300.0, help="seconds per turn")
    p.add_argument("--loglevel", default="WARNING", help="worker log level")
    p.add_argument("--keep-logs", action="store_true", help="keep and print where worker logs are")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if importlib.util.find_spec("mcp_server_time") is None:
        print("bench/mcp_stdio.py needs the reference server: pip install mcp-server-time")
        return 2
    return bench_main(args, run, "chorus-bench-mcp-")


def _turn(client: object, agent: str, timeout: float) -> tuple[float, float]:
    """(job wall time, tool batch time) of one turn, in seconds."""
    from orchestrator import Client
    from schemas import EventName

    assert isinstance(client, Client)
    began = time.monotonic()
    job = client.submit(agent, "What time is it?")
    answer = job.result(timeout=timeout)
    wall = time.monotonic() - began
    assert answer == "times=12", answer
    events = list(job.events(deltas=False, timeout=10))
    started = [e.time for e in events if e.name is EventName.TOOL_STARTED]
    ended = [e.time for e in events if e.name is EventName.TOOL_COMPLETED]
    assert len(ended) == 12, [e.name for e in events]
    return wall, (max(ended) - min(started)).total_seconds()


def run(args: argparse.Namespace, workdir: Path) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_exit)
    run_id = secrets.token_hex(4)
    prefix = f"chorus-bench-mcp-{run_id}"
    with ExitStack() as stack:
        _, db_url = client_services(stack, args.admin_url, run_id, prefix, TASKS_MODULE)
        from orchestrator.store.migrate import upgrade

        upgrade(db_url)
        node = f"bench-mcp-{run_id}"
        cmd = chorus_worker_cmd(node, "threads", 16, args.loglevel)
        log = workdir / "worker.log"
        worker = stack.enter_context(worker_process("worker", cmd, worker_env(), log))

        from orchestrator import Client
        from orchestrator.settings import load_settings

        client = Client(load_settings())
        stack.callback(client.close)
        wait_ready(client.celery, worker)
        print("12 parallel get_current_time calls (mcp-server-time over stdio), 1 worker")
        print(f"{'side':<28}{'turn':>5}{'job wall s':>12}{'tool batch s':>14}", flush=True)
        walls: dict[str, list[float]] = {side: [] for side in SIDES}
        for n in range(args.turns):
            for side, agent in SIDES.items():
                wall, batch = _turn(client, agent, args.turn_timeout)
                walls[side].append(wall)
                print(f"{side:<28}{n + 1:>5}{wall:>12.2f}{batch:>14.2f}", flush=True)
        print()
        for side, values in walls.items():
            print(
                f"{side:<28} job wall: first {values[0]:.2f} s, "
                f"median {statistics.median(values):.2f} s over {len(values)} turns"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
