"""`chorus alive`: a node is alive while one of its processes touched its
file within the limit (issue 21, item 20)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.liveness import beats_dir, start_heartbeat


def _alive(state: Path, *args: str) -> int:
    result = CliRunner().invoke(app, ["alive", *args], env={"CHORUS_STATE_DIR": str(state)})
    return result.exit_code


def test_alive_follows_the_freshest_file_of_the_node(tmp_path: Path) -> None:
    assert _alive(tmp_path, "--node", "llm@host") == 1  # never started
    mark = beats_dir(tmp_path) / "llm-2@host"  # a process of a --processes worker
    mark.parent.mkdir()
    mark.touch()
    assert _alive(tmp_path, "--node", "llm@host") == 0
    assert _alive(tmp_path, "--node", "tools@host") == 1
    assert _alive(tmp_path, "--node", "llm-2@hos") == 1  # the whole name, not a prefix
    past = time.time() - 120
    os.utime(mark, (past, past))
    assert _alive(tmp_path, "--node", "llm@host", "--max-age", "60") == 1
    assert _alive(tmp_path, "--node", "llm@host", "--max-age", "180") == 0


def test_the_heartbeat_touches_its_file_from_its_own_thread(tmp_path: Path) -> None:
    start_heartbeat(tmp_path, "beat-test@host", every=0.05)
    mark = beats_dir(tmp_path) / "beat-test@host"
    deadline = time.monotonic() + 5
    while not mark.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first = mark.stat().st_mtime_ns
    while mark.stat().st_mtime_ns == first:
        assert time.monotonic() < deadline, "touched once only"
        time.sleep(0.01)


@pytest.mark.parametrize("node", ["beat", "llm@pod-1"])
def test_alive_needs_no_broker(tmp_path: Path, node: str) -> None:
    # no Redis URL at all: the probe reads only the state directory
    start_heartbeat(tmp_path, node, every=60)
    deadline = time.monotonic() + 5
    while not (beats_dir(tmp_path) / node).exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert _alive(tmp_path, "--node", node) == 0
