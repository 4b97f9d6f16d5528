"""The HTTP API's routes over a real `chorus server` and fleet: jobs,
conversations, typed output, listing, and errors as JSON."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from orchestrator import Client, Settings
from tests.agents import METERED_TOKENS
from tests.faults import PrivateRedis
from tests.server.conftest import Server, bearer, job_of_message, make_token, start_server

pytestmark = pytest.mark.integration


def _submit(api: httpx.Client, agent: str, text: str, **extra: object) -> dict[str, str]:
    answer = api.post("/v1/jobs", json={"agent": agent, "input": text, **extra})
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def _error(answer: httpx.Response, status: int, kind: str) -> dict[str, object]:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["type"] == kind, body
    assert set(body) == {"type", "message", "fields"}
    return dict(body)


def test_a_job_submitted_over_http_answers_and_is_listed(api: httpx.Client) -> None:
    # Given a job of a registered agent
    job = _submit(api, "quick", "hello", priority=7, budget={"steps": 5})

    # When its result is awaited
    result = api.get(f"/v1/jobs/{job['job_id']}/result", params={"wait": 20})

    # Then it answers, and its status, usage and listing agree
    assert result.status_code == 200, result.text
    assert result.json()["output"] == "ok: hello"
    status = api.get(f"/v1/jobs/{job['job_id']}").json()
    assert (status["status"], status["agent"]) == ("completed", "quick")
    assert set(api.get(f"/v1/jobs/{job['job_id']}/usage").json()) == {"usage", "tree_usage"}
    listed = api.get("/v1/jobs", params={"agent": "quick", "status": "completed"}).json()
    assert job["job_id"] in [j["job_id"] for j in listed["jobs"]]
    assert {j["tenant"] for j in listed["jobs"]} == {"acme"}


def test_pages_follow_the_cursor_without_gaps_or_repeats(api: httpx.Client) -> None:
    ids = {_submit(api, "quick", f"page {i}")["job_id"] for i in range(3)}
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, object] = {"agent": "quick", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/v1/jobs", params=params).json()
        seen += [j["job_id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert ids <= set(seen) and len(seen) == len(set(seen))
    _error(api.get("/v1/jobs", params={"cursor": "not-a-cursor"}), 422, "InvalidRequestError")
    odd = {"agent": "a\x00b", "tenant": "\x00", "since": "0001-01-01T00:00+14:00"}
    for name, value in odd.items():
        error = _error(api.get("/v1/jobs", params={name: value}), 422, "InvalidRequestError")
        assert error["fields"] == [name]


def _one_at_a_time(http: httpx.Client, **filters: str) -> list[str]:
    """The ids of the jobs ``filters`` select, a page of one at a time."""
    seen: list[str] = []
    cursor = None
    while True:
        params = {**filters, "limit": "1"} | ({"cursor": cursor} if cursor else {})
        page = http.get("/v1/jobs", params=params)
        assert page.status_code == 200, page.text
        jobs = [j["job_id"] for j in page.json()["jobs"]]
        assert len(jobs) <= 1 and not set(jobs) & set(seen), (jobs, seen)
        seen += jobs
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return seen


def test_since_and_until_select_jobs_by_their_start_a_page_at_a_time(
    server: Server, client: Client
) -> None:
    # Given four jobs of a tenant of this test alone, started one after another
    token = make_token(client, f"window-{uuid.uuid4().hex[:8]}", "submit")
    with httpx.Client(base_url=server.url, headers=bearer(token), timeout=30) as http:
        ids = []
        for i in range(4):
            ids.append(_submit(http, "quick", f"window {i}")["job_id"])
            time.sleep(0.05)  # distinct start times
        listed = http.get("/v1/jobs").json()["jobs"]
        assert [j["job_id"] for j in listed] == ids[::-1]  # newest first
        started = {j["job_id"]: datetime.fromisoformat(j["started_at"]) for j in listed}
        between = started[ids[1]] + (started[ids[2]] - started[ids[1]]) / 2
        at = {"between": between.isoformat(), "second": started[ids[1]].isoformat()}
        last = started[ids[3]].isoformat()

        # Then pages of one cover exactly the jobs of each window, newest first:
        # started at or after `since`, before `until`
        assert _one_at_a_time(http) == ids[::-1]
        assert _one_at_a_time(http, since=at["between"]) == [ids[3], ids[2]]
        assert _one_at_a_time(http, until=at["between"]) == [ids[1], ids[0]]
        assert _one_at_a_time(http, since=at["second"], until=last) == [ids[2], ids[1]]
        assert _one_at_a_time(http, since=at["between"], until=at["between"]) == []


def test_typed_output_comes_back_as_json(api: httpx.Client) -> None:
    job = _submit(api, "extractor", "Three nights in Lisbon")
    output = api.get(f"/v1/jobs/{job['job_id']}/output", params={"wait": 20})
    assert output.status_code == 200, output.text
    assert output.json() == {"city": "Lisbon", "nights": 3}


def test_conversations_send_history_fork_and_queue(api: httpx.Client) -> None:
    # Given a finished first turn
    first = _submit(api, "quick", "one")
    api.get(f"/v1/jobs/{first['job_id']}/result", params={"wait": 20})
    conversation = first["conversation_id"]

    # When a message is sent, the history read and the conversation forked
    sent = api.post(f"/v1/conversations/{conversation}/messages", json={"text": "two"})
    second = job_of_message(api, conversation, sent)
    assert api.get(f"/v1/jobs/{second}/result", params={"wait": 20}).json()["output"] == "ok: two"
    history = api.get(f"/v1/conversations/{conversation}/messages").json()
    fork = api.post(f"/v1/conversations/{conversation}/fork")

    # Then the history holds both turns, and the fork a copy of it
    assert [m["role"] for m in history] == ["user", "assistant"] * 2
    assert fork.status_code == 201, fork.text
    copy = fork.json()["conversation_id"]
    assert api.get(f"/v1/conversations/{copy}/messages").json() == history
    assert api.delete(f"/v1/conversations/{conversation}/queue").json() == {"cleared": 0}
    assert set(api.get(f"/v1/conversations/{conversation}/usage").json()) >= {"input_tokens"}


def test_an_idempotency_key_returns_the_first_job(api: httpx.Client) -> None:
    key = uuid.uuid4().hex
    first = _submit(api, "quick", "once", idempotency_key=key)
    again = _submit(api, "quick", "once", idempotency_key=key)
    assert again["job_id"] == first["job_id"]


def test_cancel_stops_a_running_job(api: httpx.Client) -> None:
    job = _submit(api, "slow-batch", "take your time")
    busy = api.post("/v1/jobs", json={"agent": "quick", "input": "x", **_on(job)})
    _error(busy, 409, "ConversationBusyError")
    _error(api.get(f"/v1/jobs/{job['job_id']}/result"), 409, "JobNotFinishedError")
    cancelled = api.post(f"/v1/jobs/{job['job_id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    _error(api.get(f"/v1/jobs/{job['job_id']}/result"), 409, "JobFailedError")


def _on(job: dict[str, str]) -> dict[str, str]:
    return {"conversation_id": job["conversation_id"]}


@pytest.mark.parametrize(
    ("body", "status", "kind", "fields"),
    [
        (
            {"agent": {"name": "x", "model": "openai/gpt-4o"}, "input": "hi"},
            422,
            "InvalidRequestError",
            ["agent"],
        ),
        ({"agent": "no-such-agent", "input": "hi"}, 400, "UnknownAgentError", []),
        (
            {"agent": "quick", "input": "hi", "priority": 12},
            422,
            "InvalidRequestError",
            ["priority"],
        ),
        ({"agent": "quick", "input": ""}, 422, "InvalidRequestError", ["input"]),
        (
            {"agent": "quick", "input": "hi", "context_data": {"x": "\x00"}},
            422,
            "InvalidRequestError",
            ["context_data"],
        ),
        (
            {"agent": "quick", "input": "hi", "conversation_id": "nope"},
            404,
            "ConversationNotFound",
            [],
        ),
    ],
)
def test_bad_requests_answer_typed_json_errors(
    api: httpx.Client, body: dict[str, object], status: int, kind: str, fields: list[str]
) -> None:
    error = _error(api.post("/v1/jobs", json=body), status, kind)
    assert error["fields"] == fields


def test_unknown_ids_answer_404(api: httpx.Client) -> None:
    _error(api.get("/v1/jobs/nope"), 404, "JobNotFound")
    _error(api.get("/v1/jobs/nope/events"), 404, "JobNotFound")
    _error(api.get("/v1/conversations/nope/messages"), 404, "ConversationNotFound")
    _error(api.post("/v1/conversations/nope/fork"), 404, "ConversationNotFound")
    _error(api.get("/v1/jobs/a%00b"), 422, "InvalidRequestError")


def test_probes_answer_without_a_token(server: object, api: httpx.Client) -> None:
    bare = httpx.Client(base_url=str(api.base_url))
    assert bare.get("/v1/health").json() == {"status": "ok"}
    assert bare.get("/v1/ready").json() == {"postgres": True, "redis": True}


def test_readiness_follows_redis_while_liveness_stays(settings: Settings, tmp_path: Path) -> None:
    # Given a server of its own whose Redis is a private redis-server
    with PrivateRedis(tmp_path / "redis") as redis_server:
        mine = settings.model_copy(
            update={"redis_url": redis_server.url, "redis_prefix": f"ready-{uuid.uuid4().hex[:6]}"}
        )
        own = start_server(mine, tmp_path / "server.log")
        try:
            with httpx.Client(base_url=own.url, timeout=10) as bare:
                assert bare.get("/v1/ready").json() == {"postgres": True, "redis": True}

                # When its Redis goes away, readiness says which service is
                # missing with a 503, and liveness still answers
                redis_server.kill()
                down = bare.get("/v1/ready")
                assert down.status_code == 503, down.text
                assert down.json() == {"postgres": True, "redis": False}
                assert bare.get("/v1/health").json() == {"status": "ok"}

                # And once Redis is back, the server is ready again
                redis_server.start()
                back = bare.get("/v1/ready")
                assert back.status_code == 200, back.text
                assert back.json() == {"postgres": True, "redis": True}
                assert bare.get("/v1/health").status_code == 200
        finally:
            own.proc.terminate()
            own.proc.wait(15)


def test_a_budget_given_over_http_stops_the_job(api: httpx.Client) -> None:
    # Given an agent whose every model call reports 20 tokens, and which
    # would walk 10 steps, submitted over HTTP with a 50-token budget
    budget = 50
    job = _submit(api, "metered-walker", "walk", budget={"tokens": budget})

    # Then the job fails on its budget, as its status says
    _error(api.get(f"/v1/jobs/{job['job_id']}/result", params={"wait": 30}), 409, "JobFailedError")
    status = api.get(f"/v1/jobs/{job['job_id']}").json()
    assert status["status"] == "failed"
    assert status["error"].startswith("tokens budget exceeded:"), status["error"]
    # and it spent the budget and at most the one step that started under
    # it (each step checks the budget before its model call)
    usage = api.get(f"/v1/jobs/{job['job_id']}/usage").json()["tree_usage"]
    used = usage["input_tokens"] + usage["output_tokens"]
    assert budget <= used < budget + METERED_TOKENS
    assert f"{used} tokens used of {budget}" in status["error"]


def test_a_result_wait_ends_as_soon_as_its_job_is_cancelled(
    server: Server, acme: str, api: httpx.Client
) -> None:
    # Given a job that waits for a person, its result and output waited for up to 25 s
    job = _submit(api, "travel-desk", "cancelled while waited for")
    answers: list[tuple[float, httpx.Response]] = []

    def wait_for(route: str) -> None:
        with httpx.Client(base_url=server.url, headers=bearer(acme), timeout=30) as http:
            found = http.get(f"/v1/jobs/{job['job_id']}/{route}", params={"wait": 25})
            answers.append((time.monotonic(), found))

    waiters = [threading.Thread(target=wait_for, args=(route,)) for route in ("result", "output")]
    for waiter in waiters:
        waiter.start()
    time.sleep(1.0)

    # When the job is cancelled
    assert api.post(f"/v1/jobs/{job['job_id']}/cancel").status_code == 200
    cancelled_at = time.monotonic()
    for waiter in waiters:
        waiter.join(30)

    # Then both waits end at once with the job's failure, not after 25 s
    assert len(answers) == 2
    for answered_at, found in answers:
        _error(found, 409, "JobFailedError")
        assert answered_at - cancelled_at < 2.0
