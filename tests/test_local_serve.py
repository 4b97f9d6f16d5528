"""`chorus local --serve`: the job just run, on the dashboard of the
embedded stack (SQLite, the bundled redis-server), until Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from orchestrator.local import serving, serving_lock, serving_socket
from orchestrator.settings import Settings
from tests.conftest import ROOT
from tests.server.conftest import free_port
from tests.test_cli import CHORUS, run

#: Seconds `chorus local --serve` may take to run the example and serve it,
#: and to stop everything once interrupted.
START_TIMEOUT = 180.0
STOP_TIMEOUT = 60.0
TOKEN = re.compile(r"^(chorus_[0-9a-f]{8}_[0-9a-f]{48})$", re.M)
DASHBOARD = re.compile(
    r"^dashboard: (http://127\.0\.0\.1:(\d+)/dashboard/jobs/([0-9a-f]{32}))$", re.M
)
#: An agent (of tests.approval_agents) and input whose booking waits for a person.
BOOKING = ("travel-desk", "book me")
#: The line once the job ended and it serves on.
SERVING = re.compile(r"^serving on: Ctrl-C stops the server and the stack$", re.M)


def _local_env(state: Path) -> dict[str, str]:
    """No Redis or Postgres configured: the embedded default in STATE."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_")}
    env.update(CHORUS_STATE_DIR=str(state), LITELLM_LOCAL_MODEL_COST_MAP="True")
    return env


def _started_at(pid: int) -> str | None:
    """The start time of a live (not zombie) process PID, which tells it
    from a later process given the same pid; None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] == "Z" else fields[19]


def _descendants(pid: int) -> dict[int, str]:
    """Every live process under PID, with its start time."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        started = _started_at(child)
        if started is not None:
            found[child] = started
        todo += children.get(child, [])
    return found


def _redis_password(pids: dict[int, str]) -> str:
    """The embedded Redis's password, as the stack gave it to its workers
    (in their environment, which only their user may read)."""
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            found = re.fullmatch(rb"CHORUS_REDIS_URL=redis://:([\w-]+)@127\.0\.0\.1:\d+/0", entry)
            if found:
                return found.group(1).decode()
    raise AssertionError("no worker holds the embedded Redis's URL")


def _wait_for(out: Path, pattern: re.Pattern[str], proc: subprocess.Popen[bytes]) -> re.Match[str]:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        found = pattern.search(out.read_text())
        if found:
            return found
        assert proc.poll() is None, f"chorus local exited {proc.returncode}:\n{out.read_text()}"
        time.sleep(0.2)
    raise AssertionError(f"no dashboard address within {START_TIMEOUT} s:\n{out.read_text()}")


@pytest.mark.long
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_serve_shows_the_job_just_run_until_ctrl_c(tmp_path: Path) -> None:
    # Given `chorus local --serve` on a free port, as a user starts it in a terminal
    port = free_port()
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    proc = subprocess.Popen(
        [*CHORUS, "local", "--serve", "--port", str(port)],
        cwd=ROOT,
        env=_local_env(tmp_path / "state"),
        stdout=out.open("wb"),
        stderr=err.open("wb"),
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    stack: dict[int, str] = {}
    try:
        # When it has run the example: it prints the job page's address and a token
        url, shown_port, job_id = _wait_for(out, DASHBOARD, proc).groups()
        assert int(shown_port) == port
        _wait_for(out, SERVING, proc)
        token = TOKEN.search(out.read_text())
        assert token is not None, out.read_text()
        assert "(admin, tenant local); shown once, keep it:" in err.read_text()
        stack = _descendants(proc.pid)  # redis-server and the workers
        assert len(stack) >= 2, stack
        # and its Redis has a password, on none of their command lines
        password = _redis_password(stack)
        for pid in stack:
            assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
        assert re.search(r"^redis: redis://:\*\*\*@127\.0\.0\.1:\d+/0 ", out.read_text(), re.M)

        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            # Then the page asks for a login first, and the printed token logs in
            assert http.get(url).headers["location"] == "/dashboard/login"
            login = http.post("/dashboard/login", data={"token": token.group(1)})
            assert login.status_code == 303, login.text
            assert "chorus_token" in http.cookies and token.group(1) not in login.headers.get(
                "location", ""
            )
            # and the page shows the job that just ran, finished, with its answer
            page = http.get(url)
            assert page.status_code == 200, page.text[-2000:]
            assert "trip-planner" in page.text and "completed" in page.text
            assert "Booked: BK-" in page.text
            # as the API does to the bearer token, on the SQLite store:
            # the job, the jobs list and its events stream (to its end)
            http.cookies.clear()
            bearer = {"Authorization": f"Bearer {token.group(1)}"}
            job = http.get(f"/v1/jobs/{job_id}", headers=bearer).json()
            assert (job["agent"], job["status"]) == ("trip-planner", "completed"), job
            assert "Casa do Rio" in job["output"]
            listed = http.get("/v1/jobs", headers=bearer).json()["jobs"]
            assert [j["job_id"] for j in listed] == [job_id]
            stream = http.get(f"/v1/jobs/{job_id}/events", headers=bearer).text
            assert "event: turn.completed" in stream and stream.rstrip().endswith("data: {}")

        # When Ctrl-C reaches it (the terminal signals its process group)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(STOP_TIMEOUT)

        # Then it stopped cleanly, leaving no process behind, and its token
        # no longer opens anything
        assert code == 0, out.read_text()[-2000:] + err.read_text()[-3000:]
        left = {pid for pid, started in stack.items() if _started_at(pid) == started}
        assert not left, f"left running: {left}"
        with sqlite3.connect(tmp_path / "state" / "chorus.db") as db:
            (revoked,) = db.execute(
                "select revoked_at from chorus_api_token where name = 'chorus local --serve'"
            ).fetchone()
        assert revoked is not None
        # and the password was printed nowhere, logged nowhere, stored nowhere
        state = tmp_path / "state"
        assert state.stat().st_mode & 0o777 == 0o700  # chorus.db: every prompt and reply
        written = [out, err, *(p for p in state.rglob("*") if p.is_file())]
        assert {state / "workers.log", state / "redis.log", state / "chorus.db"} <= set(written)
        for path in written:
            assert password.encode() not in path.read_bytes(), path
        assert "redis://:**@127.0.0.1:" in (state / "workers.log").read_text()  # Celery's banner
    finally:
        _kill_leftovers([proc], stack)


def _kill_leftovers(procs: list[subprocess.Popen[bytes]], stack: dict[int, str]) -> None:
    """After a failed test: the commands' process groups, then their stack's
    processes still running (the same pid and start time)."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for pid, started in stack.items():
        if _started_at(pid) == started:
            os.kill(pid, signal.SIGKILL)


def test_a_taken_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run(["local", "--serve", "--port", str(port)], _local_env(tmp_path))
    assert out.returncode == 2, out.stderr
    assert out.stderr == (
        f"chorus: --port {port}: 127.0.0.1:{port} is taken (Address already in use); "
        "name a free one with --port N, or --port 0 for any\n"
    )
    assert not (tmp_path / "chorus.db").exists()

    out = run(["local", "--port", "8000"], _local_env(tmp_path))
    assert (out.returncode, out.stderr) == (
        2,
        "chorus: --port is the port of --serve: add --serve\n",
    )


def test_the_server_stops_on_sigterm_and_gives_the_signals_back(tmp_path: Path) -> None:
    # Given the served app, on any free port (0), with this process's handlers
    settings = Settings(state_dir=tmp_path, redis_url="redis://127.0.0.1:1/0", modules=[])
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with serving_socket(0) as listener, serving(settings, listener) as until_stopped:
        # When it answers, and then SIGTERM arrives while it serves on
        port = listener.getsockname()[1]
        answer = httpx.get(f"http://127.0.0.1:{port}/v1/health").status_code
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        until_stopped()

    # Then it returned (the process lives on) and the handlers are back
    assert answer == 200
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_only_a_server_alone_on_its_state_directory_revokes_stale_tokens(tmp_path: Path) -> None:
    revoked: list[str] = []
    # Given one `chorus local --serve` serving the state directory
    with serving_lock(tmp_path, lambda: revoked.append("first")):
        # When another starts beside it, Then the first's token is not stale
        with serving_lock(tmp_path, lambda: revoked.append("second")):
            pass
        assert revoked == ["first"]
    # and once none serves it, the next one revokes what earlier ones left
    with serving_lock(tmp_path, lambda: revoked.append("third")):
        pass
    assert revoked == ["first", "third"]


@pytest.mark.long
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_servers_stack_dies_with_it_and_its_token_is_revoked_by_the_next(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"

    def started(name: str) -> tuple[subprocess.Popen[bytes], Path, str, int]:
        out = tmp_path / f"{name}.txt"
        proc = subprocess.Popen(
            [*CHORUS, "local", "--serve", "--port", "0"],
            cwd=ROOT,
            env=_local_env(state),
            stdout=out.open("wb"),
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        port = int(_wait_for(out, DASHBOARD, proc).group(2))
        _wait_for(out, SERVING, proc)
        token = TOKEN.search(out.read_text())
        assert token is not None, out.read_text()
        return proc, out, token.group(1), port

    procs: list[subprocess.Popen[bytes]] = []
    stack: dict[int, str] = {}
    try:
        # Given `chorus local --serve` serving, its stack (redis-server, workers) up
        first, _, first_token, _ = started("first")
        procs.append(first)
        stack = _descendants(first.pid)
        assert len(stack) >= 2, stack
        # When it is SIGKILLed (no teardown, its token not revoked)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        # Then its stack ends with it
        deadline = time.monotonic() + STOP_TIMEOUT
        while left := {p for p, s in stack.items() if _started_at(p) == s}:
            assert time.monotonic() < deadline, f"left running: {left}"
            time.sleep(0.2)
        # and the next one on the state directory revokes the token it printed
        second, _, second_token, port = started("second")
        procs.append(second)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for token, status in ((first_token, 401), (second_token, 200)):
                answer = http.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code == status, answer.text
        os.killpg(second.pid, signal.SIGINT)
        assert second.wait(STOP_TIMEOUT) == 0
    finally:
        _kill_leftovers(procs, stack)


@pytest.mark.long
def test_a_call_waiting_for_a_person_is_approved_while_the_job_runs(tmp_path: Path) -> None:
    # Given `chorus local --serve` running an agent whose booking waits for a person
    out = tmp_path / "out.txt"
    proc = subprocess.Popen(
        [*CHORUS, "local", "--serve", "--port", "0", "-m", "tests.approval_agents", *BOOKING],
        cwd=ROOT,
        env=_local_env(tmp_path / "state"),
        stdout=out.open("wb"),
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    stack: dict[int, str] = {}
    try:
        # When the job page's address is printed, the server already answers
        # for the running job, and its call is approved through the API
        _, port, job_id = _wait_for(out, DASHBOARD, proc).groups()
        token = TOKEN.search(out.read_text())
        assert token is not None, out.read_text()
        stack = _descendants(proc.pid)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token[1]}"}
        ) as http:
            deadline = time.monotonic() + START_TIMEOUT
            while not (waiting := http.get("/v1/approvals").json()):
                assert time.monotonic() < deadline, out.read_text()
                time.sleep(0.2)
            [call] = waiting
            assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "running"
            answered = http.post(f"/v1/approvals/{call['call_id']}", json={"decision": "approve"})
            assert answered.status_code == 200, answered.text
            # Then the job completes and `chorus local` serves on
            _wait_for(out, SERVING, proc)
            assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "completed"
        assert "booked LIS-123" in out.read_text()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(STOP_TIMEOUT) == 0
    finally:
        _kill_leftovers([proc], stack)
