"""Flower and the metrics exporter, against a running fleet."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from orchestrator import Client, Settings
from tests.conftest import ROOT, worker_env
from tests.faults import free_port

pytestmark = pytest.mark.integration


def _serve(
    args: list[str], env: dict[str, str], ready_url: str
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"{args} exited with {proc.returncode}"
            try:
                if httpx.get(ready_url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{ready_url} never answered"
            time.sleep(0.3)
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


@pytest.fixture()
def flower(settings: Settings) -> Iterator[str]:
    port = free_port()
    env = worker_env(settings, FLOWER_UNAUTHENTICATED_API="true")
    url = f"http://127.0.0.1:{port}"
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.main",
        "flower",
        f"--port={port}",
        "--address=127.0.0.1",
    ]
    yield from (url for _ in _serve(args, env, f"{url}/healthcheck"))


@pytest.fixture()
def metrics_url(settings: Settings) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    args = [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "metrics",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]
    yield from (url for _ in _serve(args, worker_env(settings), url))


def _flower_tasks(flower: str, conversation_id: str) -> list[dict[str, Any]]:
    tasks = httpx.get(f"{flower}/api/tasks", params={"limit": 1000}, timeout=5).json()
    return [t for t in tasks.values() if conversation_id[:8] in (t.get("args") or "")]


def test_flower_shows_the_jobs_tasks_by_name(client: Client, workers: Any, flower: str) -> None:
    # Given Flower watching the fleet (its event receiver connects a little
    # after its web server answers: wait until it has seen a first job's task)
    first = client.submit("trip-planner", "Porto, before Flower listens")
    first.result(timeout=60)
    deadline = time.monotonic() + 30
    while not _flower_tasks(flower, first.conversation_id):
        assert time.monotonic() < deadline, "Flower never saw a task"
        time.sleep(0.5)
    # when a job runs
    job = client.submit("trip-planner", "Lisbon, seen by Flower")
    job.result(timeout=60)

    # Then Flower's API lists its tasks with readable names, args and states
    deadline = time.monotonic() + 30
    while True:
        ours = _flower_tasks(flower, job.conversation_id)
        names = sorted(t["name"] for t in ours)
        # task events reach Flower a little after the job ends: wait for all
        # (2 steps, 4 tools, at least one advance), each finished
        seen_all = names.count("chorus.step") >= 2 and names.count("chorus.tool") >= 4
        if seen_all and "chorus.advance" in names and all(t["state"] == "SUCCESS" for t in ours):
            break
        assert time.monotonic() < deadline, f"Flower saw only {names}"
        time.sleep(0.5)
    tools = sorted(
        re.search(r"tool=(\w+)", t["args"]).group(1) for t in ours if t["name"] == "chorus.tool"
    )  # type: ignore[union-attr]
    assert tools == ["book_trip", "flights", "hotels", "weather"]
    assert sum(t["name"] == "chorus.step" for t in ours) == 2


def _value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    assert match, f"{sample} not in metrics"
    return float(match.group(1))


def test_metrics_endpoint_counts_turns_calls_latency_tokens_and_queues(
    client: Client, workers: Any, metrics_url: str
) -> None:
    before = httpx.get(metrics_url, timeout=10).text
    done_before = (
        _value(before, 'chorus_turns_total{outcome="completed"}')
        if "chorus_turns_total{" in before
        else 0.0
    )

    client.submit("trip-planner", "Lisbon, counted").result(timeout=60)

    text = httpx.get(metrics_url, timeout=10).text
    assert _value(text, 'chorus_turns_total{outcome="completed"}') == done_before + 1
    assert _value(text, 'chorus_turns_total{outcome="started"}') >= 1
    assert _value(text, 'chorus_tool_calls_total{outcome="completed"}') >= 4
    assert _value(text, 'chorus_model_calls_total{outcome="completed"}') >= 2
    assert _value(text, "chorus_model_call_seconds_count") >= 2
    assert _value(text, "chorus_step_seconds_count") >= 2
    assert _value(text, 'chorus_tokens_total{kind="input"}') > 0
    assert _value(text, 'chorus_queue_depth{queue="llm"}') >= 0
    assert 'chorus_model_call_seconds_bucket{le="+Inf"}' in text


def test_worker_logs_are_json_with_ids_and_no_secrets(
    client: Client, workers: dict[str, Any]
) -> None:
    job = client.submit("trip-planner", "Lisbon, logged")
    job.result(timeout=60)
    time.sleep(0.5)  # let the worker flush its log lines
    lines = [
        json.loads(line)
        for w in workers.values()
        for line in w.log_path.read_text().splitlines()
        if line.startswith("{")
    ]
    ours = [line for line in lines if line.get("conversation_id") == job.conversation_id]
    assert any("model answered" in line["message"] for line in ours)
    tool_lines = [line for line in ours if line.get("tool")]
    assert {line["tool"] for line in tool_lines} == {"weather", "flights", "hotels", "book_trip"}
    assert all(line["turn_id"] == job.id and line["root_id"] == job.root_id for line in tool_lines)
    assert all("correlation_id" in line for line in tool_lines)
    everything = "\n".join(w.log_path.read_text() for w in workers.values())
    assert "sk-test-not-a-secret" not in everything
