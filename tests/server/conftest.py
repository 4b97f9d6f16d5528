"""A real `chorus server` process against the shared test fleet, and tokens."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import Client, Settings
from orchestrator.store import token_sql
from tests.conftest import ROOT, worker_env

CHORUS = [sys.executable, "-m", "orchestrator.cli"]
#: Seconds between keep-alive comments of the test server's event streams.
KEEPALIVE = 0.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    log: Path
    proc: subprocess.Popen[bytes]


def start_server(
    settings: Settings, log: Path, timeout: float = 60.0, port: int | None = None
) -> Server:
    """`chorus server` on ``port`` (default: a free one), once /v1/health answers."""
    port = port or free_port()
    proc = subprocess.Popen(
        [*CHORUS, "server", "--port", str(port), "--keepalive", str(KEEPALIVE), "-l", "info"],
        cwd=ROOT,
        env=worker_env(settings),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chorus server exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return Server(url, log, proc)
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"chorus server did not start:\n{log.read_text()}")


@pytest.fixture(scope="session")
def server(settings: Settings, workers: Any) -> Iterator[Server]:
    found = start_server(settings, Path(settings.state_dir) / "server.log")
    try:
        yield found
    finally:
        found.proc.terminate()
        found.proc.wait(15)


def make_token(client: Client, tenant: str, scope: str, name: str | None = None) -> str:
    with client.runtime.session() as session:
        _row, token = token_sql.create(session, tenant, token_sql.Scope(scope), name)
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="session")
def acme(client: Client) -> str:
    """A submit token of tenant ``acme``."""
    return make_token(client, "acme", "submit", "acme-app")


@pytest.fixture(scope="session")
def globex(client: Client) -> str:
    """A submit token of another tenant."""
    return make_token(client, "globex", "submit", "globex-app")


@pytest.fixture(scope="session")
def acme_reader(client: Client) -> str:
    return make_token(client, "acme", "read", "acme-dashboard")


@pytest.fixture
def api(server: Server, acme: str) -> Iterator[httpx.Client]:
    """An HTTP client of the server, as tenant ``acme`` (submit scope)."""
    with httpx.Client(base_url=server.url, headers=bearer(acme), timeout=30) as http:
        yield http


def sse(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """The events of a Server-Sent Events stream, as dicts of their fields
    (a comment is ``{"comment": text}``)."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if fields:
                yield fields
            fields = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            key, _, value = line.partition(":")
            fields[key] = value.removeprefix(" ")


def job_of_message(http: httpx.Client, conversation_id: str, sent: httpx.Response) -> str:
    """The job a sent message started, once it is stored."""
    assert sent.status_code == 202, sent.text
    entry = sent.json()["entry_id"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        job = http.get(f"/v1/conversations/{conversation_id}/queue/{entry}").json()["job_id"]
        if job:
            return str(job)
        time.sleep(0.1)
    raise AssertionError(f"message {entry} started no job")


class Follower:
    """An event stream read by a thread of its own: each frame with the
    time it arrived (``time.monotonic()``), until the stream ends."""

    def __init__(self, server: Server, token: str, path: str, **headers: str) -> None:
        self.frames: list[tuple[float, dict[str, str]]] = []
        self.status: int | None = None
        self.ended = threading.Event()
        self.ended_at = 0.0
        args = (server.url, path, {**bearer(token), **headers})
        threading.Thread(target=self._read, args=args, daemon=True).start()

    def _read(self, url: str, path: str, headers: dict[str, str]) -> None:
        try:
            with (
                httpx.Client(base_url=url, headers=headers, timeout=60) as http,
                http.stream("GET", path) as answer,
            ):
                self.status = answer.status_code
                for frame in sse(answer.iter_lines()):
                    self.frames.append((time.monotonic(), frame))
        finally:
            self.ended_at = time.monotonic()
            self.ended.set()

    def events(self) -> list[dict[str, str]]:
        """The frames but keep-alive comments."""
        return [f for _, f in self.frames if "comment" not in f]

    def wait_for(self, name: str, timeout: float = 30.0) -> None:
        """Until an event ``name`` arrived."""
        deadline = time.monotonic() + timeout
        while not any(f.get("event") == name for f in self.events()):
            assert not self.ended.is_set(), f"the stream ended before {name}: {self.events()}"
            assert time.monotonic() < deadline, f"no {name} within {timeout} s"
            time.sleep(0.05)
