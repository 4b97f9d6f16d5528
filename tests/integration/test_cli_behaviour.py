"""The CLI as a script would use it: exit statuses, verbatim model text,
one-line errors, unwrapped piped output, JSON Lines events."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from orchestrator import Settings
from tests.agents import VERBATIM
from tests.conftest import worker_env
from tests.test_cli import run

pytestmark = pytest.mark.integration


def _job_id(stdout: str) -> str:
    match = re.search(r"job ([0-9a-f]{32})", stdout)
    assert match, stdout
    return match.group(1)


def test_follow_exits_non_zero_when_the_job_fails(settings: Settings, workers: Any) -> None:
    # Given an agent whose first model call fails
    out = run(["submit", "failing-child", "go", "--follow"], worker_env(settings))

    # Then submit --follow reports the failure and exits 1
    assert out.returncode == 1, out.stdout + out.stderr
    assert "failed job" in out.stdout and "Traceback" not in out.stderr


def test_model_text_is_printed_verbatim_and_unwrapped(settings: Settings, workers: Any) -> None:
    # Given a model answer with Rich markup, a bare closing tag and a long
    # line, printed to a pipe (not a terminal)
    env = worker_env(settings, COLUMNS="80")
    out = run(["submit", "verbatim", "say it", "--follow"], env)

    # Then submit prints it exactly, on one line, and succeeds
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"answer: {VERBATIM}\n" in out.stdout
    status = run(["status", _job_id(out.stdout)], env)
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"answer: {VERBATIM}\n" in status.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["submit", "no-such-agent", "hi"], "unknown agent 'no-such-agent'"),
        (["submit", "quick", "hi", "--context-data", "{not json"], "--context-data is not JSON"),
        (["submit", "quick", "hi", "--context-data", "[1, 2]"], "must be a JSON object"),
        (["submit", "quick", "hi", "--priority", "10"], "priority: Input should be less than"),
        (["status", "0" * 32], f"no job '{'0' * 32}'"),
        (["events", "0" * 32], f"no job '{'0' * 32}'"),
        (["send", "0" * 32, "hi"], f"no conversation '{'0' * 32}'"),
    ],
)
def test_user_mistakes_print_one_line_and_exit_2(
    settings: Settings, args: list[str], says: str
) -> None:
    out = run(args, worker_env(settings))
    assert out.returncode == 2, out.stdout + out.stderr
    # (aside from what litellm prints while tests.agents registers its
    # custom-priced test models: that goes to stderr, not to stdout)
    noise = ("LiteLLM:", "Provider List")
    lines = [ln for ln in out.stderr.splitlines() if ln and not any(n in ln for n in noise)]
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_events_prints_json_lines_and_resumes_after_the_last_seq(
    settings: Settings, workers: Any
) -> None:
    # Given a finished job
    env = worker_env(settings)
    submitted = run(["submit", "quick", "lines please", "--follow"], env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = _job_id(submitted.stdout)

    # When its events are printed
    out = run(["events", job_id], env)

    # Then each line is one JSON object, in order, ending with the turn's end
    assert out.returncode == 0, out.stderr
    assert all(line.startswith("{") for line in out.stdout.splitlines()), repr(out.stdout[:3000])
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert events and events[-1]["name"] == "turn.completed"
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)

    # And resuming from the last seq ends at once with nothing to print
    resumed = run(["events", job_id, "--since", str(events[-1]["seq"])], env, timeout=60)
    assert resumed.returncode == 0 and resumed.stdout == "", resumed.stdout + resumed.stderr
