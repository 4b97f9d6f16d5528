"""Every example in the README runs (see tests/readme.py for how).

Each fenced block is enumerated; each is run, or listed here with the
reason it is not, so the README cannot drift from the code unnoticed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator import Settings
from tests import readme
from tests.conftest import ROOT, tool_calls, worker_env

#: Blocks not run, by their first line, with the reason.
NOT_RUN = {
    "CHORUS_TEST_REDIS_URL=redis://127.0.0.1:6379/0 C": "it is the command running these tests",
    "CHORUS_TEST_REDIS_URL=redis://127.0.0.1:6379/0 \\": "the same command, on three lines",
    "cp .env.example .env            # set OPENAI_API": (
        "deployment: needs a Docker engine and provider keys; compose.yaml and .env.example are "
        "checked offline by tests/deploy/test_compose.py (docker-compose config, every command)"
    ),
    "kubectl create secret generic chorus-env \\": (
        "deployment: needs a Kubernetes cluster; the chart and helm/values-example.yaml are "
        "checked offline by tests/deploy/test_helm.py (helm lint --strict, helm template, "
        "kubernetes-validate --strict)"
    ),
    ".venv/bin/python bench/throughput.py     # model": (
        "benchmarks load the machine for minutes by design and print figures; they assert nothing"
    ),
}

#: Blocks run in part: the first line, the part that runs, and why the rest does not.
PARTLY = {
    "python3 -m venv .venv && .venv/bin/pip install -": (
        ".venv/bin/chorus local",
        "creating a venv and installing from the network takes minutes; the tests run "
        "in an environment where that install was done",
    ),
}

#: Files the blocks that are not run name: they must exist.
NAMED_FILES = [".env.example", "compose.yaml", "helm/chorus", "helm/values-example.yaml"]
NAMED_FILES += [f"bench/{name}.py" for name in ("step_overhead", "fanout", "throughput")]
NAMED_FILES += [f"bench/{name}.py" for name in ("history", "storage", "model_client", "api")]


def _first(block: readme.Block) -> str:
    """A block's key: the start of its first line."""
    return block.body.strip().splitlines()[0][:48]


def _bash(block: readme.Block) -> str:
    """The block as run here: ``chorus`` is this worktree's CLI, README
    service URLs are the test services'."""
    return block.body.replace(".venv/bin/chorus", "chorus").replace(
        ".venv/bin/python", '"$CHORUS_PYTHON"'
    )


def _run_bash(script: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in bash in its own process group; whatever it left
    running in the background (workers, beat) is stopped when it ends."""
    preamble = 'chorus() { "$CHORUS_PYTHON" -m orchestrator.cli "$@"; }\nset -e\n'
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            ["bash", "-c", preamble + script],
            cwd=ROOT,
            env={**env, "CHORUS_PYTHON": sys.executable},
            stdout=out,
            stderr=err,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
        finally:
            _stop_group(proc.pid)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def _stop_group(pgid: int) -> None:
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def test_every_block_is_run_or_listed_with_a_reason() -> None:
    seen: set[str] = set()
    for block in readme.blocks():
        assert block.lang in ("python", "bash", "text"), f"{block}: say which language"
        if block.lang == "bash":
            first = _first(block)
            seen.add(first)
            assert first in NOT_RUN or first in PARTLY or first in RUN_BASH, (
                f"{block}: run it in a test or list it in NOT_RUN with the reason"
            )
    assert set(NOT_RUN) | set(PARTLY) | set(RUN_BASH) <= seen, "a listed block left the README"
    for name in NAMED_FILES:
        assert (ROOT / name).exists(), name


def test_the_declarations_are_what_the_workers_load() -> None:
    # The README's tools and agents are this module's body (tests/readme.py),
    # which the test workers import through tests.agents.
    from orchestrator import registry

    names = ("planner", "todo-planner", "help-desk", "billing", "demo", "web-researcher")
    for agent in (*names, "team-lead", "careful-planner", "log-reader", "crawler"):
        assert registry.get_agent(agent).name == agent
    assert registry.get_agent("planner").model == "scripted/readme-planner"
    assert registry.get_agent("careful-planner").context_tokens == 100_000


@pytest.mark.integration
def test_the_python_client_blocks_run_against_the_fleet(
    settings: Settings, workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the environment a user's client would have
    for key, value in worker_env(settings).items():
        if key.startswith("CHORUS_"):
            monkeypatch.setenv(key, value)
    namespace = {k: v for k, v in vars(readme).items() if not k.startswith("__")}
    namespace["__name__"] = "readme_client"

    # When every client block runs, in README order, in one namespace
    ran, clients = [], []
    for block in readme.blocks():
        if block.lang == "python" and block.is_client:
            exec(compile(block.body, f"README.md:{block.line}", "exec"), namespace)
            ran.append(block.line)
            if namespace.get("client") not in clients:
                clients.append(namespace["client"])

    # Then they ran, and their jobs did what the README says
    assert len(ran) == 12
    assert namespace["refused"] == ["model_settings.api_base"]
    assert namespace["planned"].result() == "Lisbon, three nights, booked."
    assert [(i.id, i.status) for i in namespace["planned"].plan()] == [
        (1, "completed"),
        (2, "completed"),
    ]
    assert len(namespace["updates"]) == 3
    assert namespace["handed"].result() == "Done: order 42 refunded"
    assert namespace["handed"].status().agent == "billing"
    assert namespace["switch"] == [
        {
            "from_agent": "help-desk",
            "to_agent": "billing",
            "message": "a refund of order 42",
            "tool_request_id": namespace["switch"][0]["tool_request_id"],
        }
    ]
    error, fare, airports = namespace["fare_job"].result().split(" | ")
    assert error == (
        "Error: invalid arguments for tool 'airline.fare': $.origin: 'Lisbon' is too long"
    )
    assert json.loads(fare) == {"route": "LIS-JFK", "cabin": "economy", "usd": 420}
    assert json.loads(airports) == ["LIS", "OPO", "FAO"]
    events = namespace["fare_job"].events(deltas=False)
    requested = [e.data["tool"] for e in events if e.name == "tool.requested"]
    assert requested == ["airline.fare", "airline.fare", "atlas.list_all_airports"]
    assert namespace["whole"] == namespace["fetch_log"]("api")
    assert namespace["job"].status().structured == {"city": "Lisbon", "nights": 3}
    assert namespace["again"].result() == "Four nights in Lisbon, rebooked."
    # the support agent's model failed twice with 503; the fallback saw no address
    helped = namespace["helped"]
    assert helped.result() == ("Fallback model here. You wrote: I am [email]: where is my order?")
    failed = [e for e in helped.events(deltas=False) if e.name == "llm.failed"]
    assert [(e.data["status"], e.data["model"]) for e in failed] == [
        (503, "scripted/readme-support")
    ] * 2
    kept = clients[0].history(helped.conversation_id)[0].content[0].text
    assert kept == "I am ada@example.com: where is my order?"
    # the crawler's 12 calls ran 4 at a time, every job answered
    report = namespace["report"]
    assert report.result() == "12 pages checked, all up."
    calls = tool_calls(clients[0], report.id)
    assert [c.segment for c in calls] == [0] * 4 + [1] * 4 + [2] * 4
    assert [j.result() for j in namespace["nightly"]] == [report.result()] * 3
    for client in clients:
        client.close()


def _running_against_real_services(settings: Settings, tmp_path: Path) -> dict[str, str]:
    env = worker_env(settings, CHORUS_REDIS_PREFIX=f"readme-{uuid.uuid4().hex[:8]}")
    env["CHORUS_STATE_DIR"] = str(tmp_path)
    return env


#: Bash blocks run whole, by their first line: the test that runs each.
RUN_BASH = {
    "export CHORUS_REDIS_URL=redis://127.0.0.1:6379/0": "test_running_against_real_services",
    "chorus local --example pipeline": "test_the_pipeline_example_runs_on_the_embedded_default",
    # tests/server/test_readme_blocks.py runs these two, tokens first
    "chorus server --host 127.0.0.1 --port 8000 &": "test_the_http_api_blocks_run",
    "ACME=$(chorus token create --tenant acme --scope": "test_the_http_api_blocks_run",
}


@pytest.mark.integration
@pytest.mark.timeout(420)  # three workers and beat start on a shared machine
def test_running_against_real_services(settings: Settings, tmp_path: Path) -> None:
    (block,) = [
        b
        for b in readme.blocks()
        if RUN_BASH.get(_first(b)) == "test_running_against_real_services"
    ]
    script = _bash(block)
    # The README's service URLs become the test services' (the test
    # database, a Redis key prefix of its own so its workers take only its jobs)
    script = script.replace("redis://127.0.0.1:6379/0", settings.redis_url or "")
    script = script.replace("postgresql+psycopg://postgres@127.0.0.1:5432/chorus", settings.db_url)
    env = _running_against_real_services(settings, tmp_path)
    try:
        out = _run_bash(script, env, timeout=400)
    finally:
        r = redis.Redis.from_url(settings.redis_url or "")
        for key in r.scan_iter(f"{env['CHORUS_REDIS_PREFIX']}*"):
            r.delete(key)
        r.close()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "completed job" in " ".join(out.stdout.split())


@pytest.mark.long
def test_the_first_command_runs_the_demo(tmp_path: Path) -> None:
    (block,) = [b for b in readme.blocks() if _first(b) in PARTLY]
    part, _why = PARTLY[_first(block)]
    assert part in block.body
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_")}
    env.update(CHORUS_STATE_DIR=str(tmp_path), LITELLM_LOCAL_MODEL_COST_MAP="True")
    out = _run_bash(part.replace(".venv/bin/chorus", "chorus"), env, timeout=170)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "completed job" in " ".join(out.stdout.split())


def test_each_benchmark_command_starts() -> None:
    # The benchmarks are not run here (NOT_RUN), but each command, as written,
    # must start from the repository root: --help shows its options
    (block,) = [b for b in readme.blocks() if _first(b) in NOT_RUN and "bench/" in b.body]
    commands = [line.split("#")[0].strip() for line in block.body.strip().splitlines()]
    assert len(commands) == 10
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_")}
    for command in commands:
        out = _run_bash(
            _bash(readme.Block(0, "bash", f"{command} --help", block.line)), env, timeout=120
        )
        assert out.returncode == 0, command + out.stderr[-3000:]
        assert "usage:" in out.stdout, command


@pytest.mark.long
def test_the_pipeline_example_runs_on_the_embedded_default(tmp_path: Path) -> None:
    (block,) = [b for b in readme.blocks() if _first(b) == "chorus local --example pipeline"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_")}
    env.update(CHORUS_STATE_DIR=str(tmp_path), LITELLM_LOCAL_MODEL_COST_MAP="True")
    # a user's own modules do not keep the example's from loading
    env["CHORUS_MODULES"] = "examples.parallel_tools"
    out = _run_bash(_bash(block), env, timeout=170)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = " ".join(out.stdout.split())
    assert "completed job" in text and "answer: Approved on iteration 2." in text


def test_the_architecture_document_is_in_the_repository_and_complete() -> None:
    from schemas import EventName

    text = (ROOT / "README.md").read_text()
    assert "(docs/architecture.md)" in text and "../shared" not in text
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for name in EventName:
        assert f"| `{name.value}` |" in doc, f"docs/architecture.md lacks {name.value}"
