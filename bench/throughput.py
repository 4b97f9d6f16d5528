"""Model calls per second through Chorus, against a model client alone.

What is measured
----------------
A loopback OpenAI-compatible server (``bench/loopback_server.py``, its own
process, asyncio) answers every request after ``--latency`` seconds
(default 0.5). A turn is model → 1 tool → model: the server asks for one
call of the no-op tool, then answers text. Four rows, one after the other
in the same run, each counted at the server over a steady-state window
(``--window`` seconds after ``--ramp`` seconds of warm-up), so every row
counts model calls the same way:

- **openai SDK alone**: ``--load-processes`` processes (default 2) x
  ``--load-threads`` threads (default 100), each thread running turns in a
  loop with ``chat.completions.create(stream=True)`` (``bench/throughput_load.py``);
- **litellm alone**: the same with ``litellm.completion(stream=True)``;
- **raw Celery**: the floor Celery itself sets, with no database: the
  turn as plain Celery tasks (``bench/step_overhead_tasks.py``'s
  ``bench.model_step`` → ``chain(bench.tool, bench.model_advance)`` →
  ``bench.model_step``, the history in the task arguments) making the model
  call Chorus makes (:func:`orchestrator.llm.call.complete`, same model,
  messages and tool), on the same Celery configuration and the same worker
  layout, ``--in-flight`` turns in flight from this process (a thread per
  turn slot sends the first task and waits on a Redis list the last one
  pushes to);
- **Chorus**: ``--in-flight`` turns (default 200) in flight at all times,
  all submitted and awaited from this one process (one ``Client``; a thread
  per turn slot: ``submit`` then ``result()``, again), on real ``chorus
  worker`` processes: ``--llm-workers`` (default one per core) taking the
  ``llm`` queue with ``--pool``/``--concurrency`` (default threads, 150),
  and one worker for ``tools,control`` (``--tools-pool``/``--tools-concurrency``,
  default threads, 32). The agent is ``bench-loopback``
  (``bench/loopback_agent.py``): model ``openai/loopback-bench`` at the
  server's ``api_base``; its API key is a dummy ``OPENAI_API_KEY`` in the
  workers' environment.

The raw Celery and Chorus rows' windows open once ``--in-flight`` turns
have finished (every turn slot went through its first-use costs once; at
most 90 s). Printed: model calls/s of each row, the ratios Chorus / litellm (target
>= 1.0) and Chorus / SDK (stretch >= 0.5), raw Celery / litellm (the best
Chorus could do on Celery) and Chorus / raw Celery, and CPU ms per model
call: of the row's processes (load processes, or the workers), of this
client process (raw Celery, Chorus), of the server, and of the whole
machine (every process: Postgres, Redis, other load). For raw Celery and
Chorus also the turns finished in the window, their median latency
(Little's law: in flight / latency = turns/s) and the limits that were
hit (pool timeouts, too many connections) from the worker logs; for Chorus
the peak Postgres connections of the bench database and Redis clients.
Redis is ``CHORUS_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) under
a fresh prefix deleted at the end;
Postgres is ``CHORUS_DATABASE_URL`` or a database created on
``--admin-url`` and dropped at the end; each Chorus process keeps 20
connections and opens at most 2 more (``CHORUS_DB_POOL_SIZE``,
``CHORUS_DB_POOL_OVERFLOW``), so the fleet fits a default
``max_connections`` of 100.

Run from the repo root::

    .venv/bin/python bench/throughput.py
    .venv/bin/python bench/throughput.py --rows chorus --in-flight 400 --concurrency 200
    .venv/bin/python bench/throughput.py --rows litellm,raw
    .venv/bin/python bench/throughput.py --rows chorus --py-spy "$(command -v py-spy)"
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import socket
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(REPO))

from bench._harness import (  # noqa: E402
    DEFAULT_ADMIN,
    DEFAULT_REDIS,
    ModelServer,
    Worker,
    bench_main,
    database,
    group_cpu_seconds,
    machine_busy_seconds,
    model_server,
    print_py_spy,
    purge_redis,
    py_spy,
    raise_exit,
    self_cpu_seconds,
    tail,
    wait_ready,
    worker_process,
)
from bench.loopback_agent import (  # noqa: E402
    BASE_ENV,
    LOOPBACK_AGENT,
    LOOPBACK_MODEL,
    expected_answer,
    job_input,
    register,
)

TASKS_MODULE = "bench.loopback_agent"
RAW_TASKS_MODULE = "bench.step_overhead_tasks"
ROWS = ("sdk", "litellm", "raw", "chorus")
TITLES = {
    "sdk": "openai SDK alone",
    "litellm": "litellm alone",
    "raw": "raw Celery",
    "chorus": "Chorus",
}
#: Rows whose turns are sent and awaited from this process.
CLIENT_ROWS = ("raw", "chorus")
#: Longest wait for the Chorus (raw) row's first turns before its window.
MAX_RAMP = 90.0
#: How long the Chorus turns may take to finish after the window.
CLOSE_SECONDS = 30.0
TARGET_LITELLM = 1.0
STRETCH_SDK = 0.5
#: Worker log lines that say a limit was hit, and which limit.
LIMITS = {
    "QueuePool limit": "SQLAlchemy pool (pool_size 10 + max_overflow 40 per process)",
    "Too many connections": "redis-py connection pool (100 per client by default)",
    "too many clients": "Postgres max_connections",
    "remaining connection slots": "Postgres max_connections",
    "Connection refused": "a refused connection",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    cores = os.cpu_count() or 1
    p.add_argument("--rows", default=",".join(ROWS), help=f"rows to run, of {','.join(ROWS)}")
    p.add_argument("--latency", type=float, default=0.5, help="model latency, s (default 0.5)")
    p.add_argument(
        "--ramp",
        type=float,
        default=5.0,
        help="warm-up s before each window (Chorus: also until --in-flight turns finished)",
    )
    p.add_argument("--window", type=float, default=20.0, help="measured s of each row")
    p.add_argument("--load-processes", type=int, default=2, help="processes of the alone rows")
    p.add_argument("--load-threads", type=int, default=100, help="threads per load process")
    p.add_argument(
        "--in-flight", type=int, default=200, help="turns in flight (raw Celery, Chorus)"
    )
    p.add_argument(
        "--llm-workers", type=int, default=cores, help=f"llm worker processes (default {cores})"
    )
    p.add_argument("--pool", default="threads", help="pool of the llm workers")
    p.add_argument("--concurrency", "-c", type=int, default=150, help="slots per llm worker")
    p.add_argument("--tools-pool", default="threads", help="pool of the tools,control worker")
    p.add_argument("--tools-concurrency", type=int, default=32, help="its slots")
    p.add_argument("--admin-url", default=DEFAULT_ADMIN, help="Postgres to create the DB on")
    p.add_argument("--turn-timeout", type=float, default=120.0, help="seconds per turn")
    p.add_argument("--loglevel", default="WARNING", help="worker log level")
    p.add_argument("--py-spy", metavar="BIN", help="sample the Chorus workers in the window")
    p.add_argument("--profile-top", type=int, default=25, help="rows of each py-spy table")
    p.add_argument("--keep-logs", action="store_true", help="print where worker logs are")
    args = p.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if not args.rows or any(r not in ROWS for r in args.rows):
        p.error(f"--rows: a comma-separated subset of {','.join(ROWS)}")
    return args


# --- measuring a window ---------------------------------------------------


@dataclass
class Snapshot:
    at: float
    calls: int
    server_cpu: float
    group_cpu: float
    client_cpu: float
    machine_cpu: float

    @classmethod
    def take(cls, server: ModelServer, workers: list[Worker]) -> Snapshot:
        calls, server_cpu = server.stats()
        return cls(
            at=time.monotonic(),
            calls=calls,
            server_cpu=server_cpu,
            group_cpu=sum(group_cpu_seconds(w.proc.pid) for w in workers),
            client_cpu=self_cpu_seconds(),
            machine_cpu=machine_busy_seconds(),
        )


@dataclass
class Row:
    name: str
    seconds: float = 0.0
    calls: int = 0
    group_cpu: float = 0.0
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    machine_cpu: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    def per_call_ms(self, cpu: float) -> float:
        return cpu * 1000 / self.calls if self.calls else float("nan")


def measure(
    name: str,
    server: ModelServer,
    workers: list[Worker],
    args: argparse.Namespace,
    ramp: float | None = None,
) -> Row:
    """Sleep the ramp (``--ramp`` unless given), then count calls and CPU
    over the window."""
    time.sleep(args.ramp if ramp is None else ramp)
    for worker in workers:
        worker.check()
    before = Snapshot.take(server, workers)
    time.sleep(args.window)
    after = Snapshot.take(server, workers)
    for worker in workers:
        worker.check()
    return Row(
        name=name,
        seconds=after.at - before.at,
        calls=after.calls - before.calls,
        group_cpu=after.group_cpu - before.group_cpu,
        client_cpu=after.client_cpu - before.client_cpu,
        server_cpu=after.server_cpu - before.server_cpu,
        machine_cpu=after.machine_cpu - before.machine_cpu,
    )


# --- the rows -------------------------------------------------------------


def alone_row(
    kind: str, server: ModelServer, env: dict[str, str], args: argparse.Namespace, workdir: Path
) -> Row:
    """A model client alone: its load processes, measured at the server."""
    with ExitStack() as stack:
        workers = []
        for i in range(args.load_processes):
            cmd = [sys.executable, "-m", "bench.throughput_load", "--client", kind]
            cmd += ["--base", server.base_url, "--threads", str(args.load_threads)]
            log = workdir / f"load-{kind}-{i}.log"
            workers.append(stack.enter_context(worker_process(f"{kind}{i}", cmd, env, log)))
        for worker in workers:
            wait_for_line(worker, "ready", 120.0)
        row = measure(TITLES[kind], server, workers, args)
        errors = sum(w.log_path.read_text(errors="replace").count("error: ") for w in workers)
        if errors:
            row.notes.append(f"{errors} failed calls (see {workers[0].log_path.name})")
        return row


def wait_for_line(worker: Worker, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in worker.log_path.read_text(errors="replace"):
        worker.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{worker.name} not ready:\n{tail(worker.log_path)}")
        time.sleep(0.2)


@dataclass
class Turns:
    """The client side of a row: ``in_flight`` threads, each running a turn
    (``turn``: start it, wait for its answer) again, until stopped."""

    turn: Callable[[], str]
    in_flight: int
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    finished: list[tuple[float, float]] = field(default_factory=list)  # (end, latency)
    errors: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for _ in range(self.in_flight):
            thread = threading.Thread(target=self._loop, daemon=True)
            thread.start()
            self.threads.append(thread)

    def _loop(self) -> None:
        expected = expected_answer(1)
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                answer = self.turn()
                if answer != expected:
                    raise RuntimeError(f"answered {answer!r}, expected {expected!r}")
            except Exception as exc:  # counted and reported; the loop goes on
                with self.lock:
                    self.errors.append(repr(exc))
                time.sleep(0.5)
                continue
            end = time.monotonic()
            with self.lock:
                self.finished.append((end, end - began))

    def settle(self, count: int, least: float, most: float) -> float:
        """Wait until ``count`` turns have finished (every slot went through
        its first-use costs once), at least ``least`` and at most ``most``
        seconds; the seconds waited."""
        began = time.monotonic()
        while time.monotonic() - began < most:
            with self.lock:
                done = len(self.finished)
            if done >= count and time.monotonic() - began >= least:
                break
            time.sleep(0.5)
        return time.monotonic() - began

    def close(self, timeout: float) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def between(self, start: float, end: float) -> list[float]:
        with self.lock:
            return [latency for at, latency in self.finished if start <= at < end]


@contextmanager
def peaks(db_url: str, admin_url: str, redis_url: str) -> Iterator[dict[str, int]]:
    """Sample, once a second, the connections to the bench's database and
    Redis's connected clients; the peaks are in the yielded dict at exit."""
    import psycopg
    import redis

    found = {"postgres": 0, "redis": 0}
    database_name = db_url.rsplit("/", 1)[-1].split("?", 1)[0]
    stop = threading.Event()

    def sample() -> None:
        r = redis.Redis.from_url(redis_url)
        with psycopg.connect(admin_url, autocommit=True) as conn:
            while not stop.wait(1.0):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database_name,)
                ).fetchone()
                found["postgres"] = max(found["postgres"], int(row[0]) if row else 0)
                clients = int(r.info("clients")["connected_clients"])
                found["redis"] = max(found["redis"], clients)
        r.close()

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        stop.set()
        thread.join(10)


def start_workers(
    stack: ExitStack,
    command: list[str],
    label: str,
    env: dict[str, str],
    run_id: str,
    args: argparse.Namespace,
    workdir: Path,
) -> tuple[list[Worker], list[str]]:
    """The worker layout of the rows with workers: ``--llm-workers``
    processes on ``llm``, one on ``tools,control``, each started as
    ``command`` plus its options; the workers and their node names."""
    layout: list[tuple[str, list[str]]] = [
        (f"llm{i}", ["-Q", "llm", "-P", args.pool, "-c", str(args.concurrency)])
        for i in range(args.llm_workers)
    ]
    layout.append(
        ("tools", ["-Q", "tools,control", "-P", args.tools_pool, "-c", str(args.tools_concurrency)])
    )
    host = socket.gethostname()
    workers, nodes = [], []
    for name, options in layout:
        node = f"bench-tp-{label}{name}-{run_id}"
        cmd = [*command, *options, "-l", args.loglevel, "-n", f"{node}@%h"]
        log = workdir / f"{label}{name}.log"
        workers.append(stack.enter_context(worker_process(f"{label}{name}", cmd, env, log)))
        nodes.append(f"{node}@{host}")
    return workers, nodes


def turns_window(
    key: str,
    turns: Turns,
    server: ModelServer,
    workers: list[Worker],
    args: argparse.Namespace,
    during: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> Row:
    """Start the turns; once ``--in-flight`` have finished, measure the
    window (inside ``during``) and note the turns' latency and failures."""
    turns.start()
    ramp = turns.settle(args.in_flight, args.ramp, MAX_RAMP)
    print(f"{key} ramp: {ramp:.1f} s until {args.in_flight} turns had finished", flush=True)
    with during():
        window_start = time.monotonic()
        row = measure(TITLES[key], server, workers, args, ramp=0.0)
        window_end = time.monotonic()
    latencies = turns.between(window_start, window_end)
    if latencies:
        row.notes.append(
            f"{args.in_flight} turns in flight, {len(latencies)} finished in the window, "
            f"median turn {statistics.median(latencies):.2f} s "
            f"(2 model calls of {args.latency} s each)"
        )
    if turns.errors:
        row.notes.append(f"{len(turns.errors)} failed turns, e.g. {turns.errors[0][:200]}")
    return row


def raw_row(
    server: ModelServer, env: dict[str, str], args: argparse.Namespace, workdir: Path, run_id: str
) -> Row:
    """The turn as plain Celery tasks with Chorus's model call, no database:
    ``in_flight`` turns from this process, on the same worker layout."""
    import redis

    import bench.step_overhead_tasks as tasks
    from bench.step_overhead import wait_done

    celery = str(Path(sys.executable).parent / "celery")
    with ExitStack() as stack:
        command = [celery, "-A", RAW_TASKS_MODULE, "worker"]
        workers, nodes = start_workers(stack, command, "raw-", env, run_id, args, workdir)
        began = time.monotonic()
        for worker, node in zip(workers, nodes, strict=True):
            wait_ready(tasks.app, worker, node=node)
        print(f"raw Celery workers ready in {time.monotonic() - began:.1f}s", flush=True)

        trouble = stack.enter_context(client_trouble())
        # a connection per waiting turn slot: each blocks on its own list
        pool = redis.BlockingConnectionPool.from_url(
            tasks.app.conf.broker_url, max_connections=args.in_flight + 4, timeout=None
        )
        waiter = redis.Redis(connection_pool=pool)
        stack.callback(waiter.close)
        prefix = tasks.app.conf.broker_transport_options["global_keyprefix"].rstrip(":")
        settings = {"api_base": server.base_url}
        messages = tasks.first_messages(job_input(1, 1))

        def turn() -> str:
            turn_id = uuid.uuid4().hex
            tasks.raw_model_step.apply_async((turn_id, LOOPBACK_MODEL, settings, messages))
            return wait_done(waiter, tasks.done_key(prefix, turn_id), args.turn_timeout)

        turns = Turns(turn, args.in_flight)
        stack.callback(turns.close, CLOSE_SECONDS)
        row = turns_window("raw", turns, server, workers, args)
        row.notes.extend(limits_hit(workers))
        for what, count in trouble.items():
            row.notes.append(f"client process: {count} x {what}")
        return row


def chorus_row(
    server: ModelServer,
    env: dict[str, str],
    db_url: str,
    redis_url: str,
    run_id: str,
    args: argparse.Namespace,
    workdir: Path,
) -> Row:
    """Chorus on real workers: ``in_flight`` turns from this one client."""
    chorus = str(Path(sys.executable).parent / "chorus")
    with ExitStack() as stack:
        workers, nodes = start_workers(stack, [chorus, "worker"], "", env, run_id, args, workdir)

        from orchestrator import Client
        from orchestrator.settings import load_settings

        client = Client(load_settings())
        stack.callback(client.close)
        began = time.monotonic()
        for worker, node in zip(workers, nodes, strict=True):
            wait_ready(client.celery, worker, node=node)
        print(f"chorus workers ready in {time.monotonic() - began:.1f}s", flush=True)

        trouble = stack.enter_context(client_trouble())

        def turn() -> str:
            job = client.submit(LOOPBACK_AGENT, job_input(1, 1))
            return str(job.result(timeout=args.turn_timeout))

        turns = Turns(turn, args.in_flight)
        stack.callback(turns.close, CLOSE_SECONDS)
        probes: dict[str, Any] = {}

        @contextmanager
        def during() -> Iterator[None]:
            with (
                peaks(db_url, args.admin_url, redis_url) as peak,
                py_spy(args.py_spy, workers, workdir) as samples,
            ):
                probes.update(peak=peak, samples=samples)
                yield

        row = turns_window("chorus", turns, server, workers, args, during)
        peak = probes["peak"]
        row.notes.append(
            f"peak Postgres connections to the bench db {peak['postgres']} "
            f"(server max_connections shared by everything), Redis clients {peak['redis']}"
        )
        row.notes.extend(limits_hit(workers))
        for what, count in trouble.items():
            row.notes.append(f"client process: {count} x {what}")
        for name, path in probes["samples"].items():
            print_py_spy(f"{name} worker", path, max(row.calls, 1), args.profile_top, "call")
        return row


@contextmanager
def client_trouble() -> Iterator[dict[str, int]]:
    """Count what goes wrong in this process outside the turn loops: errors
    logged (by Celery, kombu, redis-py...) and exceptions that end a thread,
    by their last line (e.g. ``MaxConnectionsError: Too many connections``)."""
    import logging

    found: dict[str, int] = {}
    lock = threading.Lock()

    def count(what: str) -> None:
        with lock:
            found[what] = found.get(what, 0) + 1

    class Counter(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            exc = record.exc_info[1] if record.exc_info else None
            what = f"{type(exc).__name__}: {exc}" if exc else record.getMessage()
            count(f"logged {record.levelname}: {what[:160]}")

    handler = Counter(logging.ERROR)
    previous = threading.excepthook

    def hook(hooked: threading.ExceptHookArgs) -> None:
        count(f"thread died: {hooked.exc_type.__name__}: {str(hooked.exc_value)[:160]}")
        previous(hooked)

    logging.getLogger().addHandler(handler)
    threading.excepthook = hook
    try:
        yield found
    finally:
        threading.excepthook = previous
        logging.getLogger().removeHandler(handler)


def limits_hit(workers: list[Worker]) -> list[str]:
    """Lines of the worker logs that say a connection limit was hit."""
    found: dict[str, int] = {}
    for worker in workers:
        text = worker.log_path.read_text(errors="replace")
        for needle, limit in LIMITS.items():
            count = len(re.findall(re.escape(needle), text))
            if count:
                found[limit] = found.get(limit, 0) + count
    if not found:
        return ["no connection limit hit (worker logs)"]
    return [f"limit hit: {limit}: {count} log lines" for limit, count in found.items()]


# --- reporting ------------------------------------------------------------


def report(rows: dict[str, Row], args: argparse.Namespace) -> None:
    print()
    print(
        f"{'':<18} {'calls':>6} {'calls/s':>8}   cpu ms/call: {'procs':>6} {'client':>6}"
        f" {'server':>6} {'machine':>7}"
    )
    for key in ROWS:
        row = rows.get(key)
        if row is None:
            continue
        client = f"{row.per_call_ms(row.client_cpu):>6.2f}" if key in CLIENT_ROWS else f"{'-':>6}"
        print(
            f"{row.name:<18} {row.calls:>6} {row.rate:>8.1f}{'':>16}"
            f"{row.per_call_ms(row.group_cpu):>6.2f} {client}"
            f" {row.per_call_ms(row.server_cpu):>6.2f} {row.per_call_ms(row.machine_cpu):>7.2f}"
        )
    chorus = rows.get("chorus")
    goals = (("litellm", TARGET_LITELLM, "target"), ("sdk", STRETCH_SDK, "stretch"))
    for key, target, word in goals:
        other = rows.get(key)
        if chorus is None or other is None or not other.rate:
            continue
        ratio = chorus.rate / other.rate
        verdict = "met" if ratio >= target else "NOT met"
        print(f"ratio Chorus / {other.name}: {ratio:.2f} ({word} >= {target}: {verdict})")
    raw, litellm = rows.get("raw"), rows.get("litellm")
    if raw is not None and litellm is not None and litellm.rate:
        print(
            f"ratio {raw.name} / {litellm.name}: {raw.rate / litellm.rate:.2f}"
            " (Celery's own floor: about the most Chorus / litellm can reach on Celery)"
        )
    if chorus is not None and raw is not None and raw.rate:
        print(f"ratio Chorus / {raw.name}: {chorus.rate / raw.rate:.2f}")
    cores = os.cpu_count() or 1
    for row in rows.values():
        busy = row.machine_cpu / (row.seconds * cores) * 100 if row.seconds else 0.0
        print(
            f"  [{row.name}] machine busy {busy:.0f}% of {cores} cores in the window"
            " (near 100%: CPU binds)"
        )
        for note in row.notes:
            print(f"  [{row.name}] {note}")
    print(
        f"({os.cpu_count()} cores; model latency {args.latency} s; calls counted at the server"
        f" over a {args.window:.0f} s window after {args.ramp:.0f} s of ramp; procs: the"
        " row's load\n processes or workers; machine: every process, other load"
        f" included (1-min load average now {os.getloadavg()[0]:.2f}))"
    )


# --- main -----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    return bench_main(parse_args(argv), run, "chorus-bench-throughput-")


def run(args: argparse.Namespace, workdir: Path) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_exit)
    run_id = secrets.token_hex(4)
    redis_url = os.environ.get("CHORUS_REDIS_URL") or DEFAULT_REDIS
    prefix = f"chorus-bench-tp-{run_id}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["OPENAI_API_KEY"] = "bench-dummy-key"  # the loopback server ignores it
    rows: dict[str, Row] = {}
    with ExitStack() as stack:
        server = stack.enter_context(model_server(args.latency, workdir, env))
        print(
            f"model calls/s, {args.latency} s model at {server.base_url}; rows "
            f"{','.join(args.rows)}; 1-min load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        for kind in ("sdk", "litellm"):
            if kind in args.rows:
                rows[kind] = alone_row(kind, server, env, args, workdir)
                print(f"{rows[kind].name}: {rows[kind].rate:.1f} calls/s", flush=True)
        if "raw" in args.rows:
            raw_prefix = f"chorus-bench-tp-raw-{run_id}"
            stack.callback(purge_redis, redis_url, [raw_prefix])
            raw_env = {"CHORUS_REDIS_URL": redis_url, "BENCH_RAW_PREFIX": raw_prefix}
            env.update(raw_env)
            os.environ.update(raw_env)  # this process sends the raw tasks
            rows["raw"] = raw_row(server, env, args, workdir, run_id)
            print(f"{rows['raw'].name}: {rows['raw'].rate:.1f} calls/s", flush=True)
        if "chorus" in args.rows:
            db_url = stack.enter_context(database(args.admin_url, run_id))
            stack.callback(purge_redis, redis_url, [prefix])
            env.update(
                {
                    "CHORUS_REDIS_URL": redis_url,
                    "CHORUS_DATABASE_URL": db_url,
                    "CHORUS_REDIS_PREFIX": prefix,
                    "CHORUS_MODULES": TASKS_MODULE,
                    BASE_ENV: server.base_url,
                    # three workers and this client, at most 22 connections
                    # each: within a default Postgres's max_connections (100,
                    # 3 of them reserved) beside the bench's own sampler
                    "CHORUS_DB_POOL_SIZE": "20",
                    "CHORUS_DB_POOL_OVERFLOW": "2",
                }
            )
            os.environ.update(env)  # this process is the client
            register(server.base_url)

            from orchestrator.store.migrate import upgrade

            upgrade(db_url)
            rows["chorus"] = chorus_row(server, env, db_url, redis_url, run_id, args, workdir)
            print(f"Chorus: {rows['chorus'].rate:.1f} calls/s", flush=True)
    report(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
