"""Pieces of `chorus local`: the embedded redis-server and the supervisor
starting its worker processes in steps (issue 22: `chorus local` in under
10 s; the whole command is run by tests/test_cli.py)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import redis

from orchestrator.local import embedded_redis
from orchestrator.settings import Settings
from orchestrator.supervisor import Supervisor


def _refused(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_the_embedded_redis_keeps_its_data_in_the_state_dir_across_starts(
    tmp_path: Path,
) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    with embedded_redis(settings) as url:
        assert url.startswith("redis://127.0.0.1:")
        client = redis.Redis.from_url(url, decode_responses=True)
        client.set("greeting", "hello")
        client.close()
    assert _refused(url)  # stopped with the block
    assert (tmp_path / "state" / "redis.rdb").is_file()  # its snapshot, saved on the way out

    with embedded_redis(settings) as again:
        client = redis.Redis.from_url(again, decode_responses=True)
        assert client.get("greeting") == "hello"
        client.close()


def test_the_supervisor_starts_its_children_in_steps() -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor = Supervisor(lambda i: sleeper, 3)
    try:
        supervisor.start(1)
        assert len(supervisor.pids) == 1
        first = supervisor.pids[0]
        supervisor.start()
        assert len(supervisor.pids) == 3
        assert supervisor.pids[0] == first  # the first one was not started again
        supervisor.start()
        assert len(supervisor.pids) == 3
        assert supervisor.check() is None
    finally:
        supervisor.stop(grace=5)
    assert supervisor.pids == []


@pytest.mark.parametrize("upto", [0, 5])
def test_the_supervisor_never_starts_more_than_its_count(upto: int) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor = Supervisor(lambda i: sleeper, 2)
    try:
        supervisor.start(upto)
        assert len(supervisor.pids) == min(upto, 2)
    finally:
        supervisor.stop(grace=5)


def test_the_embedded_redis_moves_on_when_another_server_took_its_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between choosing a free port and binding it, another program may take
    it; a Redis answering there must not be mistaken for the embedded one."""
    import subprocess

    import orchestrator.local as local

    squatted = local._free_port()
    squatter = subprocess.Popen(
        [str(local.redis_server()), "--port", str(squatted), "--bind", "127.0.0.1", "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    try:
        while _refused(f"redis://127.0.0.1:{squatted}/0"):
            assert squatter.poll() is None
        ports = iter([squatted])
        monkeypatch.setattr(local, "_free_port", lambda: next(ports, None) or _os_port())
        with embedded_redis(Settings(state_dir=tmp_path / "state")) as url:
            assert f":{squatted}/" not in url
            client = redis.Redis.from_url(url)
            assert client.info("server")["process_id"] != squatter.pid
            client.close()
    finally:
        squatter.terminate()
        squatter.wait()


def _os_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
