"""Bytes Postgres stores per turn against the bytes of the turn's messages.

What is measured
----------------
One turn of the agent ``bench-storage`` (``bench/storage_tasks.py``): its
scripted model calls the tool ``bench_fetch`` once a step for ``--steps``
steps, the tool returning ``--kb`` KB of random text (Postgres cannot
compress it, so compression does not flatter the figure), then answers.
The turn runs through real worker processes (``chorus worker``) against
Redis and Postgres.

**Raw bytes** are the JSON of the conversation's messages as the model sees
them (``to_openai_messages`` of the stored history: system prompt, user
input, assistant messages with their tool calls, tool results), UTF-8.
**Stored bytes** are, over the turn's rows in ``chorus_message``,
``chorus_tool_call``, ``chorus_event`` and ``chorus_turn``, the sum of
``pg_column_size`` of every column (what the values take on disk, TOAST
and its compression included; tuple headers and indexes left out), after
the turn and its last writes are done. Keep ``--kb`` under the agent's
``tool_output_limit`` (30,000 characters): a longer result is archived on
its call row while the model sees a view of it (docs/architecture.md,
Decisions), so the raw bytes would no longer count the whole result. The bench prints both per table
and the ratio stored / raw; runs ``--turns`` turns and prints each.

Redis is ``CHORUS_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) under
a fresh key prefix deleted at the end; Postgres is ``CHORUS_DATABASE_URL``
if set, otherwise a database ``chorus_bench_<random>`` created on
``--admin-url``, migrated, and dropped at the end.

Run from the repo root::

    .venv/bin/python bench/storage.py
    .venv/bin/python bench/storage.py --kb 20 --steps 10 --turns 2
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
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
    client_services,
    raise_exit,
    wait_ready,
    worker_process,
)

TASKS_MODULE = "bench.storage_tasks"
#: The tables a turn writes, and how a row is known to be the turn's.
TABLES = {
    "chorus_message": "turn_id = :turn",
    "chorus_tool_call": "turn_id = :turn",
    "chorus_event": "turn_id = :turn",
    "chorus_turn": "id = :turn",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--kb", type=int, default=20, help="KB a tool call returns (default 20)")
    p.add_argument("--steps", type=int, default=5, help="tool-calling steps a turn (default 5)")
    p.add_argument("--turns", type=int, default=2, help="turns measured (default 2)")
    p.add_argument("--admin-url", default=DEFAULT_ADMIN, help="Postgres to create the DB on")
    p.add_argument("--turn-timeout", type=float, default=300.0, help="seconds per turn")
    p.add_argument("--loglevel", default="WARNING", help="worker log level")
    p.add_argument("--keep-logs", action="store_true", help="keep and print where worker logs are")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return bench_main(parse_args(argv), run, "chorus-bench-storage-")


def stored_bytes(session: object, turn_id: str) -> dict[str, int]:
    """Per table: the sum of ``pg_column_size`` of every column of the turn's rows."""
    from sqlalchemy import text
    from sqlmodel import Session

    assert isinstance(session, Session)
    sizes: dict[str, int] = {}
    for table, where in TABLES.items():
        columns = session.execute(
            text(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = :t ORDER BY ordinal_position"
            ),
            {"t": table},
        ).scalars()
        total = " + ".join(f'coalesce(pg_column_size("{c}"), 0)' for c in columns)
        sizes[table] = int(
            session.execute(
                text(f"SELECT coalesce(sum({total}), 0) FROM {table} WHERE {where}"),
                {"turn": turn_id},
            ).scalar_one()
        )
    return sizes


def raw_bytes(client: object, conversation_id: str) -> int:
    """UTF-8 bytes of the JSON of the conversation's messages as the model sees them."""
    from orchestrator import Client
    from orchestrator.llm.call import to_openai_messages
    from orchestrator.registry import get_agent

    assert isinstance(client, Client)
    system = get_agent("bench-storage").system
    messages = to_openai_messages(system, client.history(conversation_id))
    return len(json.dumps(messages, ensure_ascii=False).encode())


def run(args: argparse.Namespace, workdir: Path) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_exit)
    run_id = secrets.token_hex(4)
    prefix = f"chorus-bench-storage-{run_id}"
    bindir = Path(sys.executable).parent
    with ExitStack() as stack:
        _, db_url = client_services(
            stack,
            args.admin_url,
            run_id,
            prefix,
            TASKS_MODULE,
            CHORUS_BENCH_STORAGE_KB=str(args.kb),
            CHORUS_BENCH_STORAGE_STEPS=str(args.steps),
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        )
        from orchestrator.store.migrate import upgrade

        upgrade(db_url)
        cmd = [str(bindir / "chorus"), "worker", "-Q", "llm,control,tools", "-P", "threads"]
        cmd += ["-c", "4", "-l", args.loglevel, "-n", f"bench-storage-{run_id}@%h"]
        worker = stack.enter_context(worker_process("worker", cmd, env, workdir / "worker.log"))

        from orchestrator import Client
        from orchestrator.settings import load_settings

        client = Client(load_settings())
        stack.callback(client.close)
        wait_ready(client.celery, worker)
        print(
            f"storage per turn: {args.steps} steps, one {args.kb} KB tool result a step "
            f"(random text); 1 worker; db {db_url.rsplit('/', 1)[-1]}",
            flush=True,
        )
        header = "".join(f"{t.removeprefix('chorus_'):>11}" for t in TABLES)
        print(f"{'turn':<6}{header}{'stored':>11}{'raw':>11}{'stored/raw':>12}")
        for n in range(args.turns):
            job = client.submit("bench-storage", f"read the pages ({n})")
            answer = job.result(timeout=args.turn_timeout)
            assert answer == f"read {args.steps} pages", answer
            time.sleep(1.0)  # the turn's last events (published after commit) are stored
            with client.runtime.session() as session:
                sizes = stored_bytes(session, job.id)
            stored = sum(sizes.values())
            raw = raw_bytes(client, job.conversation_id)
            cells = "".join(f"{sizes[t]:>11,}" for t in TABLES)
            print(f"{n + 1:<6}{cells}{stored:>11,}{raw:>11,}{stored / raw:>12.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
