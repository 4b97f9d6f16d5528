"""The HTTP API's routes over a real `chorus server` and fleet: jobs,
conversations, typed output, listing, and errors as JSON."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

from tests.server.conftest import Server, bearer, job_of_message

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
