"""The README's "Tokens and tenants" and "HTTP API" blocks, run as written
(one script, tokens first) against the test fleet, on a free port."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Settings
from tests import readme
from tests.conftest import worker_env
from tests.server.conftest import free_port
from tests.test_readme import RUN_BASH, _bash, _first, _run_bash

pytestmark = pytest.mark.integration


@pytest.mark.long
def test_the_http_api_blocks_run(settings: Settings, workers: Any, tmp_path: Path) -> None:
    # Given the two blocks, in the order a reader runs them
    found = {
        _first(b): b
        for b in readme.blocks()
        if RUN_BASH.get(_first(b)) == "test_the_http_api_blocks_run"
    }
    tokens, api = (found[k] for k in sorted(found, key=lambda k: not k.startswith("ACME")))
    port = str(free_port())
    script = (_bash(tokens) + "\n" + _bash(api)).replace("8000", port)

    # When they run against the test fleet
    out = _run_bash(script, worker_env(settings), timeout=120)

    # Then each command worked: the job's events streamed to its end, a
    # resume started after seq 3, and the answer came back
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ids = [int(i) for i in re.findall(r"^id: (\d+)$", out.stdout, re.M)]
    assert out.stdout.count("event: end") == 2
    assert "event: turn.completed" in out.stdout
    first_end = ids.index(max(ids)) + 1
    assert ids[first_end:] == [i for i in ids[:first_end] if i > 3]
    assert '"output":"Lisbon, three nights: ' in out.stdout
    assert "revoked" in out.stdout and "dashboard" in out.stdout
