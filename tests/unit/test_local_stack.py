"""Pieces of `chorus local`: the embedded redis-server and the supervisor
starting its worker processes in steps (issue 22: `chorus local` in under
10 s; the whole command is run by tests/test_cli.py)."""

from __future__ import annotations

import re
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
        assert re.fullmatch(r"redis://:[\w-]{43}@127\.0\.0\.1:\d+/0", url)  # its password
        client = redis.Redis.from_url(url, decode_responses=True)
        client.set("greeting", "hello")
        client.close()
    assert _refused(url)  # stopped with the block
    assert (tmp_path / "state" / "redis.rdb").is_file()  # its snapshot, saved on the way out

    with embedded_redis(settings) as again:
        client = redis.Redis.from_url(again, decode_responses=True)
        assert client.get("greeting") == "hello"
        client.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_embedded_redis_answers_only_its_password_and_never_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any user of the machine may connect to a loopback port: without the
    password the embedded Redis refuses everything, and with it CONFIG (SET
    dir and dbfilename, then SAVE, writes a chosen file anywhere)."""
    import subprocess

    # Given a state directory an older Chorus made with the umask's mode
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    started: list[list[str]] = []
    popen = subprocess.Popen

    def recording(args: list[str], *rest: object, **kwargs: object) -> object:
        started.append(list(args))
        return popen(args, *rest, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "Popen", recording)
    with embedded_redis(Settings(state_dir=state)) as url:
        monkeypatch.undo()
        password = redis.Redis.from_url(url).connection_pool.connection_kwargs["password"]
        assert len(password) >= 40 and url.startswith(f"redis://:{password}@127.0.0.1:")
        client = redis.Redis.from_url(url)
        pid = client.info("server")["process_id"]
        # Then a client without the password, or with another, gets nothing
        stranger = url.replace(f":{password}@", "")
        for other in (stranger, url.replace(password, password[::-1])):
            with pytest.raises(redis.AuthenticationError):
                redis.Redis.from_url(other).set("key", "value")
        # and CONFIG is refused even with it
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.config_set("dir", str(tmp_path))
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.execute_command("DEBUG", "SLEEP", "0")
        assert client.set("key", "value")
        client.close()
        # and the password is on no command line (what `ps` shows everyone)
        assert started and all(password not in " ".join(args) for args in started)
        assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    # nor in its log; and the state directory is its owner's alone
    assert password not in (state / "redis.log").read_text()
    assert state.stat().st_mode & 0o777 == 0o700


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
