"""Tokens and tenants over HTTP: every rule, through a real `chorus server`."""

from __future__ import annotations

import json
import threading
import time
import uuid

import httpx
import pytest
from sqlmodel import col, select
from typer.testing import CliRunner

from orchestrator import Client, Settings
from orchestrator.cli import app
from orchestrator.errors import InvalidRequestError
from orchestrator.store.tables import Conversation, Turn
from tests.integration.test_liveness import _chorus
from tests.server.conftest import KEEPALIVE, Follower, Server, bearer, make_token

pytestmark = pytest.mark.integration


def _http(server: Server, token: str | None) -> httpx.Client:
    headers = bearer(token) if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def _done(http: httpx.Client, agent: str, text: str, **extra: object) -> dict[str, str]:
    job = http.post("/v1/jobs", json={"agent": agent, "input": text, **extra})
    assert job.status_code == 201, job.text
    found = dict(job.json())
    answer = http.get(f"/v1/jobs/{found['job_id']}/result", params={"wait": 20})
    assert answer.status_code == 200, answer.text
    found["output"] = answer.json()["output"]
    return found


@pytest.mark.parametrize(
    "authorization",
    [None, b"Bearer", b"Bearer chorus_nope_nope", b"Basic abc", b"Bearer x\xc3\xa9"],
)
def test_a_request_without_a_valid_token_is_401(
    server: Server, authorization: bytes | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        answer = http.get("/v1/jobs", headers=headers)
    assert answer.status_code == 401, answer.text
    assert answer.json()["type"] == "AuthenticationError"


def test_a_read_token_reads_and_cannot_change_anything(
    server: Server, acme: str, acme_reader: str
) -> None:
    with _http(server, acme) as writer, _http(server, acme_reader) as reader:
        job = _done(writer, "quick", "for the reader")
        conversation = job["conversation_id"]
        # reading works
        assert reader.get(f"/v1/jobs/{job['job_id']}").status_code == 200
        assert reader.get(f"/v1/conversations/{conversation}/messages").status_code == 200
        # changing does not
        attempts = [
            reader.post("/v1/jobs", json={"agent": "quick", "input": "no"}),
            reader.post(f"/v1/jobs/{job['job_id']}/cancel"),
            reader.post(f"/v1/conversations/{conversation}/messages", json={"text": "no"}),
            reader.delete(f"/v1/conversations/{conversation}/queue"),
            reader.post(f"/v1/conversations/{conversation}/fork"),
        ]
    for answer in attempts:
        assert answer.status_code == 403, answer.text
        assert answer.json()["type"] == "PermissionDeniedError"


def test_the_tenant_is_the_tokens_and_other_tenants_see_nothing(
    server: Server, client: Client, acme: str, globex: str
) -> None:
    with _http(server, acme) as mine, _http(server, globex) as theirs:
        # Given acme's job, which tries to claim another tenant
        job = _done(mine, "tenant-echo", "who am I", context_data={"tenant": "globex", "x": 1})
        conversation = job["conversation_id"]

        # Then its tools saw acme's tenant
        assert json.loads(job["output"]) == {"tenant": "acme", "x": 1}

        # And to globex every id of it is unknown
        for answer in (
            theirs.get(f"/v1/jobs/{job['job_id']}"),
            theirs.get(f"/v1/jobs/{job['job_id']}/result"),
            theirs.get(f"/v1/jobs/{job['job_id']}/events"),
            theirs.post(f"/v1/jobs/{job['job_id']}/cancel"),
        ):
            assert answer.status_code == 404, answer.text
            assert answer.json()["type"] == "JobNotFound"
            assert job["job_id"] in answer.json()["message"]
        for answer in (
            theirs.get(f"/v1/conversations/{conversation}/messages"),
            theirs.get(f"/v1/conversations/{conversation}/events"),
            theirs.post(f"/v1/conversations/{conversation}/messages", json={"text": "hi"}),
            theirs.post(f"/v1/conversations/{conversation}/fork"),
            theirs.delete(f"/v1/conversations/{conversation}/queue"),
            theirs.post(
                "/v1/jobs", json={"agent": "quick", "input": "x", "conversation_id": conversation}
            ),
        ):
            assert answer.status_code == 404, answer.text
            assert answer.json()["type"] == "ConversationNotFound"
        listed = theirs.get("/v1/jobs", params={"tenant": "acme"}).json()["jobs"]
        assert listed == []
        assert job["job_id"] not in [j["job_id"] for j in theirs.get("/v1/jobs").json()["jobs"]]

        # And an idempotency key is each tenant's own
        key = uuid.uuid4().hex
        first = mine.post("/v1/jobs", json={"agent": "quick", "input": "a", "idempotency_key": key})
        other = theirs.post(
            "/v1/jobs", json={"agent": "quick", "input": "b", "idempotency_key": key}
        )
        assert first.json()["job_id"] != other.json()["job_id"]

    # An admin token sees every tenant's, and filters by tenant
    with _http(server, make_token(client, "ops", "admin")) as admin:
        assert admin.get(f"/v1/jobs/{job['job_id']}").status_code == 200
        acme_jobs = admin.get("/v1/jobs", params={"tenant": "acme", "limit": 500}).json()["jobs"]
        assert job["job_id"] in [j["job_id"] for j in acme_jobs]
        assert {j["tenant"] for j in acme_jobs} == {"acme"}


def test_a_job_is_its_tenants_from_the_first_moment_it_exists(
    server: Server, client: Client, acme: str
) -> None:
    """The tenant was stamped on a submitted job's conversation by a second
    transaction: a reader between the two (or a crash) saw a job of no tenant."""
    marker = uuid.uuid4().hex
    seen: dict[str, tuple[str | None, str]] = {}
    done = threading.Event()

    def watch() -> None:  # every turn of this test, as soon as it can be read
        query = (
            select(Turn.id, Conversation.tenant, Turn.context_data)
            .join(Conversation, col(Conversation.id) == col(Turn.root_id))
            .where(col(Turn.input_text).startswith(marker))
        )
        while not done.is_set():
            with client.runtime.session() as session:
                for turn_id, tenant, data in session.exec(query).all():
                    seen.setdefault(turn_id, (tenant, data["tenant"]))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with _http(server, acme) as http:
            jobs = []
            for i in range(20):
                job = http.post(
                    "/v1/jobs",
                    json={
                        "agent": "quick",
                        "input": f"{marker} {i}",
                        "context_data": {"tenant": "globex"},  # hostile: replaced
                    },
                )
                assert job.status_code == 201, job.text
                jobs.append(job.json())
            http.get(f"/v1/jobs/{jobs[0]['job_id']}/result", params={"wait": 20})
            forked = http.post(f"/v1/conversations/{jobs[0]['conversation_id']}/fork")
    finally:
        time.sleep(0.2)
        done.set()
        watcher.join(10)
    assert set(seen) == {job["job_id"] for job in jobs}
    # never a moment without its tenant, and context_data's is the token's too
    assert set(seen.values()) == {("acme", "acme")}
    assert forked.status_code == 201, forked.text
    with client.runtime.session() as session:
        copy = session.get(Conversation, forked.json()["conversation_id"])
        assert copy is not None and copy.tenant == "acme"


@pytest.mark.long
def test_tokens_from_the_cli_work_until_revoked_and_are_never_shown_again(
    server: Server, settings: Settings, client: Client
) -> None:
    # Given a token created with the CLI
    created = _chorus(
        settings, "token", "create", "--tenant", "initech", "--scope", "submit", "--name", "ci"
    )
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    prefix = token.split("_")[1]
    assert token.startswith(f"chorus_{prefix}_") and prefix in created.stderr

    # When it is used, listed and revoked
    with _http(server, token) as http:
        job = _done(http, "quick", "with a CLI token")
        listed = _chorus(settings, "token", "list")
        revoked = _chorus(settings, "token", "revoke", prefix)
        after = http.get(f"/v1/jobs/{job['job_id']}")
    again = _chorus(settings, "token", "revoke", prefix)

    # Then it worked, the list shows its prefix but never the token, and revoked it is 401
    assert listed.returncode == 0 and prefix in listed.stdout and "initech" in listed.stdout
    secret = token.split("_", 2)[2]
    assert secret not in listed.stdout
    assert revoked.returncode == 0, revoked.stderr
    assert after.status_code == 401 and after.json()["type"] == "AuthenticationError"
    assert again.returncode == 2 and "no active token" in again.stderr
    # and the token is nowhere: not in the server's log, not in the job's events or rows
    assert secret not in server.log.read_text(errors="replace")
    events = client.job(job["job_id"]).events(deltas=False)
    assert all(secret not in event.model_dump_json() for event in events)
    with client.runtime.session() as session:
        from orchestrator.store.token_sql import ApiToken

        row = session.get(
            ApiToken, next(r.id for r in session.query(ApiToken) if r.prefix == prefix)
        )
        assert row is not None and secret not in row.hash and row.revoked_at is not None


#: How long after its token's revocation a test server's stream may still
#: run: the check interval (the test server's keep-alive is shorter than
#: RECHECK), and slack for a loaded machine.
REVOKED_WITHIN = KEEPALIVE + 2.0


def revoked_stream_ended(follower: Follower, revoked_at: float) -> None:
    """``follower``'s stream ended within the bound with the 401 body, and
    not one frame came after that (or after the bound)."""
    assert follower.ended.wait(REVOKED_WITHIN + 5), "the revoked token's stream is still open"
    assert follower.ended_at - revoked_at < REVOKED_WITHIN
    *_, error, end = follower.events()
    assert error["event"] == "error" and end["event"] == "end"
    assert json.loads(error["data"]) == {
        "type": "AuthenticationError",
        "message": "the token was revoked",
        "fields": [],
    }
    assert all(at - revoked_at < REVOKED_WITHIN for at, _ in follower.frames)


def _waiting_job(server: Server, client: Client, name: str) -> tuple[str, dict[str, str]]:
    """A new submit token of acme named NAME, and the job it submitted,
    which waits for a person (travel-desk's booking)."""
    token = make_token(client, "acme", "submit", name)
    with _http(server, token) as http:
        job = http.post("/v1/jobs", json={"agent": "travel-desk", "input": name}).json()
    return token, dict(job)


def _approve(server: Server, token: str, conversation_id: str) -> None:
    """Approve the conversation's one waiting call, with TOKEN."""
    with _http(server, token) as http:
        [call] = http.get("/v1/approvals", params={"conversation_id": conversation_id}).json()
        answer = http.post(f"/v1/approvals/{call['call_id']}", json={"decision": "approve"})
        assert answer.status_code == 200, answer.text


@pytest.mark.long
def test_a_revoked_tokens_open_streams_end_within_the_bound(
    server: Server, settings: Settings, client: Client, acme: str
) -> None:
    # Given a token following a job that waits for a person, by its job's
    # stream and its conversation's, and another token following it too
    token, job = _waiting_job(server, client, "to-be-revoked")
    streams = [
        Follower(server, token, f"/v1/jobs/{job['job_id']}/events"),
        Follower(server, token, f"/v1/conversations/{job['conversation_id']}/events"),
    ]
    other = Follower(server, acme, f"/v1/jobs/{job['job_id']}/events")
    for follower in (*streams, other):
        follower.wait_for("tool.approval_requested")

    # When the token is revoked with the CLI
    revoked = _chorus(settings, "token", "revoke", token.split("_")[1])
    revoked_at = time.monotonic()
    assert revoked.returncode == 0, revoked.stderr

    # Then its streams end within the bound, saying why
    for follower in streams:
        assert follower.status == 200
        revoked_stream_ended(follower, revoked_at)
    # and the other token's stream goes on: it sees the call answered and the turn end
    assert not other.ended.is_set()
    _approve(server, acme, job["conversation_id"])
    assert other.ended.wait(30)
    names = [f["event"] for f in other.events()]
    assert names[-2:] == ["turn.completed", "end"] and "tool.approved" in names
    for follower in streams:  # none of what happened after reached the revoked token
        assert "tool.approved" not in [f.get("event") for f in follower.events()]


def _waiting_for_the_result(
    server: Server, token: str, job_id: str
) -> tuple[threading.Thread, list[tuple[float, httpx.Response]]]:
    """A thread asking with TOKEN for the job's result, waiting up to 25 s,
    and where its answer goes (when it came, and the response)."""
    answers: list[tuple[float, httpx.Response]] = []

    def wait_for_the_result() -> None:
        with _http(server, token) as http:
            found = http.get(f"/v1/jobs/{job_id}/result", params={"wait": 25})
            answers.append((time.monotonic(), found))

    waiter = threading.Thread(target=wait_for_the_result)
    waiter.start()
    return waiter, answers


def test_a_result_waited_for_is_not_given_to_a_token_revoked_meanwhile(
    server: Server, settings: Settings, client: Client, acme: str
) -> None:
    # Given a job that waits for a person, and a token waiting for its result
    token, job = _waiting_job(server, client, "revoked-while-waiting")
    waiter, answers = _waiting_for_the_result(server, token, job["job_id"])
    # When the token is revoked while it waits, and the job then completes
    time.sleep(1.0)
    revoked = _chorus(settings, "token", "revoke", token.split("_")[1])
    assert revoked.returncode == 0, revoked.stderr
    _approve(server, acme, job["conversation_id"])
    waiter.join(40)

    # Then the waiting request (accepted before) gets no result but a 401,
    # whether it learnt of the revocation or of the job's end first
    [(_, found)] = answers
    assert found.status_code == 401, found.text
    assert found.json()["type"] == "AuthenticationError"
    assert "output" not in found.text


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--tenant", "", "--scope", "read"], "tenant"),
        (["--tenant", "a b", "--scope", "read"], "tenant"),
        (["--tenant", "acme", "--scope", "root"], "scope"),
        (["--tenant", "acme", "--scope", "read", "--name", ""], "name"),
    ],
)
def test_the_cli_refuses_a_bad_token_request(args: list[str], field: str) -> None:
    # checked before anything is stored (the command's exit status 2 is main()'s)
    result = CliRunner().invoke(app, ["token", "create", *args])
    assert isinstance(result.exception, InvalidRequestError), result.output
    assert result.exception.fields == [field]


def test_a_result_wait_ends_soon_after_its_token_is_revoked(
    server: Server, settings: Settings, client: Client, acme: str
) -> None:
    # Given a token waiting 25 s for the result of a job that waits for a person
    token, job = _waiting_job(server, client, "revoked-long-poll")
    waiter, answers = _waiting_for_the_result(server, token, job["job_id"])
    time.sleep(1.0)
    # When the token is revoked and nothing else happens
    revoked = _chorus(settings, "token", "revoke", token.split("_")[1])
    assert revoked.returncode == 0, revoked.stderr
    revoked_at = time.monotonic()
    waiter.join(30)

    # Then the wait ends with a 401 within the streams' bound, not after its 25 s
    [(answered_at, found)] = answers
    assert found.status_code == 401, found.text
    assert found.json()["type"] == "AuthenticationError"
    assert answered_at - revoked_at < REVOKED_WITHIN
    _approve(server, acme, job["conversation_id"])  # the job ends
