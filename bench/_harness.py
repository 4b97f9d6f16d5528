"""Helpers shared by the benchmarks in ``bench/``: a fresh Postgres database,
Redis key cleanup, worker subprocesses in their own process groups, CPU
accounting from ``/proc``, and py-spy sampling of the workers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
DEFAULT_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


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

        get_engine(url).dispose()  # engines are built lazily: this one may be new
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def client_services(
    stack: ExitStack, admin_url: str, run_id: str, prefix: str, modules: str, **extra: str
) -> tuple[str, str]:
    """Create the run's database and Redis prefix (both removed when ``stack``
    closes) and point this process, the bench's client, at them with
    ``extra`` settings: returns (Redis URL, database URL)."""
    redis_url = os.environ.get("CHORUS_REDIS_URL") or DEFAULT_REDIS
    db_url = stack.enter_context(database(admin_url, run_id))
    stack.callback(purge_redis, redis_url, [prefix])
    os.environ.update(
        {
            "CHORUS_REDIS_URL": redis_url,
            "CHORUS_DATABASE_URL": db_url,
            "CHORUS_REDIS_PREFIX": prefix,
            "CHORUS_MODULES": modules,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            **extra,
        }
    )
    return redis_url, db_url


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


def worker_env() -> dict[str, str]:
    """This process's environment for a worker: ``PYTHONPATH`` leads with the repo."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    return env


def chorus_worker_cmd(
    node: str, pool: str, concurrency: int, loglevel: str, queues: str = "llm,control,tools"
) -> list[str]:
    """``chorus worker`` from this interpreter's bin directory, named ``<node>@%h``."""
    chorus = Path(sys.executable).parent / "chorus"
    cmd = [str(chorus), "worker", "-Q", queues, "-P", pool, "-c", str(concurrency)]
    return [*cmd, "-l", loglevel, "-n", f"{node}@%h"]


def wait_ready(app: Any, worker: Worker, timeout: float = 180.0, node: str | None = None) -> None:
    """Until the worker answers a control ping (it imported litellm and connected).

    ``node``: ping that worker name (``name@host``) only; by default any
    worker answering will do (one worker per app).
    """
    deadline = time.monotonic() + timeout
    destination = [node] if node else None
    while time.monotonic() < deadline:
        worker.check()
        if app.control.ping(destination=destination, timeout=0.5):
            return
    raise RuntimeError(
        f"{worker.name} worker not ready after {timeout:.0f}s:\n{tail(worker.log_path)}"
    )


@dataclass
class ModelServer:
    """The loopback model server (``bench/loopback_server.py``) in its own process."""

    base_url: str  # ends in /v1: the ``api_base`` of the models that use it
    worker: Worker

    def stats(self) -> tuple[int, float]:
        """(chat requests served so far, the server's CPU seconds)."""
        root = self.base_url.removesuffix("/v1")
        with urllib.request.urlopen(f"{root}/stats", timeout=10) as answer:
            stats = json.load(answer)
        return int(stats["requests"]), float(stats["cpu"])


@contextmanager
def model_server(latency: float, workdir: Path, env: dict[str, str]) -> Iterator[ModelServer]:
    """Start the loopback model server on a free port, answering after
    ``latency`` seconds; stop it on exit."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "bench.loopback_server", "--port", str(port)]
    cmd += ["--latency", str(latency)]
    with worker_process("model-server", cmd, env, workdir / "model-server.log") as worker:
        server = ModelServer(f"http://127.0.0.1:{port}/v1", worker)
        deadline = time.monotonic() + 30
        while True:
            worker.check()
            try:
                server.stats()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"model server not up:\n{tail(worker.log_path)}") from None
                time.sleep(0.1)
        yield server


# --- CPU accounting -------------------------------------------------------


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU of the live processes in a process group (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        # after the command: state ppid pgrp session tty tpgid flags minflt cminflt
        # majflt cmajflt utime stime
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def machine_busy_seconds() -> float:
    """CPU time all cores spent busy (not idle or iowait) since boot: /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    busy = sum(values[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- memory ---------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def peak_rss(pid: int) -> Iterator[dict[str, float]]:
    """``{"before", "peak"}`` RSS (MB) of ``pid``, sampled every 50 ms."""
    found = {"before": rss_mb(pid), "peak": 0.0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            found["peak"] = max(found["peak"], rss_mb(pid))
            done.wait(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        done.set()
        thread.join()


# --- py-spy ---------------------------------------------------------------


@contextmanager
def py_spy(binary: str | None, workers: list[Worker], workdir: Path) -> Iterator[dict[str, Path]]:
    """``py-spy record --gil --nonblocking`` on each worker (and its subprocesses)
    until the block ends: samples of the thread holding the GIL, without pausing
    the worker (blocking sampling slowed Chorus 2x)."""
    outputs: dict[str, Path] = {}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for worker in workers if binary else []:
            out = outputs[worker.name] = workdir / f"pyspy-{worker.name}.txt"
            cmd = [str(binary), "record", "--pid", str(worker.proc.pid), "--subprocesses"]
            cmd += ["--rate", str(PY_SPY_RATE), "--format", "raw", "--output", str(out)]
            cmd += ["--gil", "--nonblocking"]  # GIL holder only: CPU in Python, no pauses
            log = (workdir / f"pyspy-{worker.name}.log").open("wb")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        time.sleep(1.0 if procs else 0.0)  # let py-spy attach
        yield outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


PY_SPY_RATE = 200
_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _frame_key(frame: str) -> str:
    found = _FRAME.match(frame.strip())
    if not found:
        return frame.strip()
    filename = found["file"]
    for marker in ("site-packages/", str(REPO) + "/", "/lib/python3.11/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{found['fn']} ({filename})"


def print_py_spy(title: str, path: Path, steps: int, top: int, unit: str = "step") -> None:
    """Self and inclusive on-CPU time per ``unit`` (``steps`` of them) from a
    py-spy raw (collapsed) file."""
    if not path.exists():
        print(f"\n[{title}] py-spy wrote nothing (see {path.with_suffix('.log')})")
        return
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame_key(f) for f in stack.split(";") if f]
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + count
        for key in set(frames):
            inclusive[key] = inclusive.get(key, 0) + count

    def ms(samples: int) -> float:
        return samples * 1000 / PY_SPY_RATE / steps

    print(f"\n[{title}] py-spy: {ms(total):.1f} ms/{unit} holding the GIL (on-CPU Python)")
    for heading, table in (("self", own), ("inclusive", inclusive)):
        print(f"  -- top {top} {heading}: ms/{unit}")
        for key, samples in sorted(table.items(), key=lambda kv: kv[1], reverse=True)[:top]:
            print(f"  {ms(samples):>8.2f}  {key[:120]}")


def raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def bench_main(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace, Path], int],
    prefix: str,
) -> int:
    """Run a benchmark in a fresh work directory for worker logs and
    profiles; keep it on error or with ``--keep-logs``, else remove it."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        code = run(args, workdir)
    except BaseException:
        print(f"worker logs in {workdir}", file=sys.stderr)
        raise
    if args.keep_logs:
        print(f"worker logs and profiles in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return code
