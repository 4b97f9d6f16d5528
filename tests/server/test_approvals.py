"""Approvals over HTTP against a real `chorus server` and fleet: listing and
answering are tenant-scoped, read tokens cannot answer, an answer counts once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import Client
from schemas import EventName
from tests.approval_agents import stored_events
from tests.server.conftest import Server, bearer, make_token

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def admin(server: Server, client: Client) -> Iterator[httpx.Client]:
    token = make_token(client, "ops", "admin", "ops-console")
    with httpx.Client(base_url=server.url, headers=bearer(token), timeout=30) as http:
        yield http


def _as(server: Server, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers=bearer(token), timeout=30)


def _waiting(
    api: httpx.Client, text: str, agent: str = "travel-desk", **extra: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A job submitted over HTTP (``extra``: more of the submit's body), and
    its one call once it waits."""
    job = api.post("/v1/jobs", json={"agent": agent, "input": text, **extra}).json()
    deadline = time.monotonic() + 30
    while True:
        found = api.get("/v1/approvals", params={"conversation_id": job["conversation_id"]})
        assert found.status_code == 200, found.text
        if found.json():
            [call] = found.json()
            return job, call
        assert time.monotonic() < deadline, "no call started waiting"
        time.sleep(0.1)


def _error(answer: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.json()["type"] == kind, answer.json()
    return dict(answer.json())


def test_a_call_is_answered_once_by_its_own_tenant(
    server: Server,
    api: httpx.Client,
    globex: str,
    acme_reader: str,
    admin: httpx.Client,
    client: Client,
) -> None:
    # Given acme's job whose book_flight call waits for a person
    job, call = _waiting(api, "book Lisbon over HTTP")
    assert (call["tool"], call["arguments"]) == ("book_flight", {"flight": "LIS-123"})
    assert call["job_id"] == job["job_id"]
    url = f"/v1/approvals/{call['call_id']}"
    approve = {"decision": "approve", "note": "within budget"}

    # Then another tenant neither sees nor answers it (404, as an unknown call)
    with _as(server, globex) as other:
        assert call["call_id"] not in [c["call_id"] for c in other.get("/v1/approvals").json()]
        mine = other.get("/v1/approvals", params={"tenant": "acme"})
        assert mine.status_code == 200 and mine.json() == []
        _error(other.post(url, json=approve), 404, "ApprovalNotFound")
    # a read token sees it and cannot answer it; an admin sees every tenant's
    with _as(server, acme_reader) as reader:
        assert call in reader.get("/v1/approvals").json()
        _error(reader.post(url, json=approve), 403, "PermissionDeniedError")
    assert call in admin.get("/v1/approvals", params={"tenant": "acme"}).json()
    assert call not in admin.get("/v1/approvals", params={"tenant": "globex"}).json()

    # When acme approves it, a second answer conflicts and changes nothing
    answered = api.post(url, json=approve)
    assert answered.status_code == 200, answered.text
    assert answered.json() == {"call_id": call["call_id"], "decision": "approved", "by": "acme-app"}
    again = _error(api.post(url, json={"decision": "deny", "reason": "late"}), 409, "ConflictError")
    assert "already approved by 'acme-app'" in again["message"]

    # Then the call ran and the audit names the token
    result = api.get(f"/v1/jobs/{job['job_id']}/result", params={"wait": 30})
    assert result.status_code == 200, result.text
    assert "booked LIS-123" in result.json()["output"]
    [audit] = stored_events(client, client.job(job["job_id"]), EventName.TOOL_APPROVED)
    assert (audit.data["by"], audit.data["note"]) == ("acme-app", "within budget")
    assert call["call_id"] not in [c["call_id"] for c in api.get("/v1/approvals").json()]


def test_a_denial_needs_a_reason_and_the_model_gets_it(api: httpx.Client) -> None:
    job, call = _waiting(api, "book Porto over HTTP")
    url = f"/v1/approvals/{call['call_id']}"

    # Bad answers are refused, naming the field, and leave the call waiting
    for bad, field in (
        ({"decision": "deny"}, "reason"),
        ({"decision": "deny", "reason": "   "}, "reason"),
        ({"decision": "deny", "reason": "a\u0000b"}, "reason"),
        ({"decision": "approve", "reason": "why"}, "reason"),
        ({"decision": "deny", "reason": "no", "note": "n"}, "note"),
        ({"decision": "maybe"}, "decision"),
        ({"decision": "approve", "by": "mallory"}, "by"),
    ):
        assert _error(api.post(url, json=bad), 422, "InvalidRequestError")["fields"] == [field]
    assert [c["call_id"] for c in api.get("/v1/approvals").json()].count(call["call_id"]) == 1
    _error(
        api.post("/v1/approvals/no-such-call", json={"decision": "approve"}),
        404,
        "ApprovalNotFound",
    )

    # When it is denied, the model gets the reason as the call's error result
    denied = api.post(url, json={"decision": "deny", "reason": "not today"})
    assert denied.json()["decision"] == "denied", denied.text
    result = api.get(f"/v1/jobs/{job['job_id']}/result", params={"wait": 30})
    assert "was not run: denied: not today" in result.json()["output"]


def test_a_budget_spent_by_a_subagent_ends_a_waiting_call(
    api: httpx.Client, client: Client, tmp_path: Path
) -> None:
    # Given a job (30-token budget) whose book_flight call waits for a person
    # beside a subagent that works on: every model call reports 20 tokens
    mark = tmp_path / "mark"
    job, call = _waiting(
        api,
        "book and spend",
        agent="guarded-lead",
        budget={"tokens": 30},
        context_data={"mark": str(mark)},
    )
    assert (call["tool"], call["arguments"]) == ("book_flight", {"flight": "GRD-1"})

    # When the subagent's next step finds the tree's budget spent
    _error(api.get(f"/v1/jobs/{job['job_id']}/result", params={"wait": 30}), 409, "JobFailedError")

    # Then the job ended on its budget, the waiting call with tool.cancelled
    status = api.get(f"/v1/jobs/{job['job_id']}").json()
    assert status["status"] == "failed"
    assert status["error"].startswith("tokens budget exceeded:"), status["error"]
    events = stored_events(client, client.job(job["job_id"]))
    [cancelled] = [e for e in events if e.name is EventName.TOOL_CANCELLED]
    assert (cancelled.conversation_id, cancelled.data["tool"]) == (
        job["conversation_id"],
        "book_flight",
    )
    assert [e.name for e in events].count(EventName.BUDGET_EXCEEDED) == 1
    listed = api.get("/v1/approvals", params={"conversation_id": job["conversation_id"]})
    assert listed.json() == []
    # and a late approval is a conflict that runs nothing
    late = api.post(f"/v1/approvals/{call['call_id']}", json={"decision": "approve"})
    _error(late, 409, "ConflictError")
    time.sleep(0.5)
    assert mark.read_text().splitlines() == ["lookup_city Porto"]
