"""The `chorus` command line, run as a user would run it."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from orchestrator import Settings
from tests.cli_inprocess import run_main
from tests.conftest import ROOT, worker_env

CHORUS = [sys.executable, "-m", "orchestrator.cli"]


def run(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CHORUS, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_help_is_fast_and_does_not_import_litellm() -> None:
    probe = "import sys, orchestrator.cli; assert 'litellm' not in sys.modules, 'litellm imported'"
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=ROOT)
    out = run(["--help"], dict(os.environ))
    assert out.returncode == 0
    for command in ("worker", "beat", "submit", "status", "events", "db", "local"):
        assert command in out.stdout


def test_local_refuses_an_unknown_example(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_")}
    env.update(CHORUS_STATE_DIR=str(tmp_path))
    out = run(["local", "--example", "nope"], env)
    assert out.returncode == 2
    assert "--example: no example 'nope'; there are trip, pipeline" in out.stderr
    assert not (tmp_path / "chorus.db").exists()  # refused before anything started


def test_a_service_that_does_not_answer_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_")}
    env.update(CHORUS_STATE_DIR=str(tmp_path), CHORUS_REDIS_URL="redis://127.0.0.1:1/0")
    out = run(["queues"], env)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.startswith("chorus: Redis does not answer: ")
    assert "Traceback" not in out.stderr

    env["CHORUS_REDIS_URL"] = os.environ.get("CHORUS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    env["CHORUS_DATABASE_URL"] = "postgresql+psycopg://postgres:hunter2@127.0.0.1:1/chorus"
    # (through the entry point, in this process: the script itself ran above)
    out = run_main(["status", "job-1"], env, monkeypatch, capsys)
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("chorus: Postgres does not answer: ")
    assert "Traceback" not in out.stderr and "hunter2" not in out.stderr


@pytest.mark.integration
def test_a_database_without_the_tables_is_one_line(settings: Settings) -> None:
    # Given a database no `chorus db upgrade` ran on
    server, name = settings.db_url.rsplit("/", 1)
    bare = f"{name}_bare"
    admin = sqlalchemy.create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{bare}"'))
        connection.execute(sqlalchemy.text(f'CREATE DATABASE "{bare}"'))
    try:
        env = worker_env(settings, CHORUS_DATABASE_URL=f"{server}/{bare}")
        # When a command reads it, then one line says what to run
        out = run(["approvals"], env)
        assert out.returncode == 1, out.stderr
        assert out.stderr == (
            "chorus: the database has no Chorus tables, or older ones: run `chorus db upgrade`\n"
        )
    finally:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{bare}"'))
        admin.dispose()


@pytest.mark.long
@pytest.mark.integration
def test_submit_follow_status_and_events_against_the_fleet(
    settings: Settings,
    workers: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = worker_env(settings)
    out = run(["submit", "trip-planner", "Lisbon for three nights", "--follow"], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "turn.completed" in out.stdout and "tool.completed" in out.stdout
    assert "Casa do Rio" in out.stdout
    job_id = re.search(r"job ([0-9a-f]{32})", out.stdout).group(1)  # type: ignore[union-attr]

    # (status and events through the entry point, in this process; the
    # script's own events: tests/integration/test_cli_behaviour.py)
    status = run_main(["status", job_id], env, monkeypatch, capsys)
    assert (
        status.returncode == 0 and "completed" in status.stdout and "Casa do Rio" in status.stdout
    )

    events = run_main(["events", job_id], env, monkeypatch, capsys)
    assert events.returncode == 0
    names = [json.loads(line)["name"] for line in events.stdout.splitlines()]  # JSON Lines
    assert names.count("tool.completed") == 4
    assert names[-1] == "turn.completed"


@pytest.mark.long
def test_local_runs_the_example_on_the_embedded_default_twice_at_once(tmp_path: Path) -> None:
    # Given no Redis or Postgres configured, and an empty state directory
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_")}
    env.update(CHORUS_STATE_DIR=str(tmp_path), LITELLM_LOCAL_MODEL_COST_MAP="True")

    # When the README's main command starts twice in it at the same moment
    # (both migrate the one SQLite file): as is, and on one core (so with
    # one worker process, not one a core: fewer start-ups on a busy machine)
    on_one_core = [
        sys.executable,
        "-c",
        f"import os, sys; os.sched_setaffinity(0, {{{min(os.sched_getaffinity(0))}}}); "
        "os.execv(sys.executable, sys.argv[1:])",
        *CHORUS,
    ]
    runs = [
        subprocess.Popen(
            [*command, "local"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        for command in (CHORUS, on_one_core)
    ]
    outputs = [run.communicate(timeout=180)[0] for run in runs]

    # Then both example jobs complete end to end (neither trips over the
    # other's CREATE TABLE), and each says where its state lives and how
    # to see the job on the dashboard (tests/test_local_serve.py serves it)
    for run, output in zip(runs, outputs, strict=True):
        assert run.returncode == 0, output[-3000:]
        text = " ".join(output.split())
        assert "completed job" in text
        assert "Casa do Rio" in text and "Booked: BK-" in text
        assert str(tmp_path / "chorus.db") in text
        job_id = re.search(r"completed job ([0-9a-f]{32})", text).group(1)  # type: ignore[union-attr]
        assert output.splitlines()[-1] == (
            "see it on the dashboard: rerun with --serve, then open "
            f"http://127.0.0.1:8000/dashboard/jobs/{job_id}"
        )
    # and each turn stored its messages in order and ran its four tools
    with sqlite3.connect(tmp_path / "chorus.db") as db:
        turns = [t for (t,) in db.execute("select distinct turn_id from chorus_message")]
        assert len(turns) == 2, turns
        for turn in turns:
            kinds = [
                k
                for (k,) in db.execute(
                    "select kind from chorus_message where turn_id = ? order by id", (turn,)
                )
            ]
            (tools,) = db.execute(
                "select count(*) from chorus_tool_call where status='completed' and turn_id = ?",
                (turn,),
            ).fetchone()
            assert kinds == ["input", "assistant", "tool_results", "assistant"], turn
            assert tools == 4, turn
