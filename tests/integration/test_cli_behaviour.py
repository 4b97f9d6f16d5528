"""The CLI as a script would use it: exit statuses, verbatim model text,
one-line errors, unwrapped piped output, JSON Lines events."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from orchestrator import Client, Settings
from tests.agents import VERBATIM
from tests.cli_inprocess import run_main
from tests.conftest import worker_env
from tests.test_cli import run

pytestmark = pytest.mark.integration


def _job_id(stdout: str) -> str:
    match = re.search(r"job ([0-9a-f]{32})", stdout)
    assert match, stdout
    return match.group(1)


def test_follow_exits_non_zero_when_the_job_fails(
    settings: Settings,
    workers: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given an agent whose first model call fails (submitted through the
    # entry point, in this process: the next test runs submit --follow as
    # the script itself)
    args = ["submit", "failing-child", "go", "--follow"]
    out = run_main(args, worker_env(settings), monkeypatch, capsys)

    # Then submit --follow reports the failure and exits 1
    assert out.returncode == 1, out.stdout + out.stderr
    assert "failed job" in out.stdout and "Traceback" not in out.stderr


def test_model_text_is_printed_verbatim_and_unwrapped(
    settings: Settings,
    workers: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a model answer with Rich markup, a bare closing tag and a long
    # line, printed to a pipe (not a terminal)
    env = worker_env(settings, COLUMNS="80")
    out = run(["submit", "verbatim", "say it", "--follow"], env)

    # Then submit prints it exactly, on one line, and succeeds
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"answer: {VERBATIM}\n" in out.stdout
    # and so does status (through the entry point, in this process: not a terminal either)
    status = run_main(["status", _job_id(out.stdout)], env, monkeypatch, capsys)
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"answer: {VERBATIM}\n" in status.stdout


#: What litellm prints while tests.agents registers its custom-priced test
#: models: it goes to stderr (not stdout), and is not the command's error.
NOISE = ("LiteLLM:", "Provider List")


def _one_line_exit_2(out: Any, says: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln and not any(n in ln for n in NOISE)]
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr


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
    settings: Settings,
    args: list[str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # (through the entry point the `chorus` script calls, in this process:
    # the next test runs one as the script itself)
    _one_line_exit_2(run_main(args, worker_env(settings), monkeypatch, capsys), says)


def test_a_user_mistake_is_one_line_and_exit_2_from_the_script_itself(settings: Settings) -> None:
    # A new interpreter: whatever importing the modules prints, stderr holds
    # one line of error and stdout nothing
    out = run(["submit", "no-such-agent", "hi"], worker_env(settings))
    _one_line_exit_2(out, "unknown agent 'no-such-agent'")
    assert out.stdout == ""


def test_events_prints_json_lines_and_resumes_after_the_last_seq(
    settings: Settings,
    client: Client,
    workers: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a finished job (submit --follow is the other tests')
    env = worker_env(settings)
    job = client.submit("quick", "lines please")
    job.result(timeout=60)
    job_id = job.id

    # When its events are printed (by the script itself: stdout is only JSON Lines)
    out = run(["events", job_id], env)

    # Then each line is one JSON object, in order, ending with the turn's end
    assert out.returncode == 0, out.stderr
    assert all(line.startswith("{") for line in out.stdout.splitlines()), repr(out.stdout[:3000])
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert events and events[-1]["name"] == "turn.completed"
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)

    # And resuming from the last seq ends at once with nothing to print
    resumed = run_main(
        ["events", job_id, "--since", str(events[-1]["seq"])], env, monkeypatch, capsys
    )
    assert resumed.returncode == 0 and resumed.stdout == "", resumed.stdout + resumed.stderr
