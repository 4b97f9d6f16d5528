"""`chorus local` killed hard (SIGKILL, the OOM killer) must not leave its
embedded redis-server running: nothing would ever stop it, and it keeps
writing the state directory's snapshot under the next run's server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = """
import sys, time
from pathlib import Path
from orchestrator.local import embedded_redis
from orchestrator.settings import Settings
with embedded_redis(Settings(state_dir=Path(sys.argv[1]))) as url:
    print(url, flush=True)
    time.sleep(120)
"""


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_embedded_redis_dies_with_a_killed_chorus_local(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "state")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        url = owner.stdout.readline().strip()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert _answers(port)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 10
        while _answers(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        orphan = _answers(port)
        if orphan:  # leave nothing behind ourselves
            import redis

            redis.Redis.from_url(url).shutdown(nosave=True)
        assert not orphan, "the embedded redis-server outlived its killed owner"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
