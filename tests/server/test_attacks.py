"""A hostile HTTP caller against a real `chorus server`: each test is an
attack that once worked (or a bound that must hold), kept so it stays shut."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from starlette.types import Message

from orchestrator import Client, Settings
from orchestrator.server import errors
from orchestrator.server.body_limit import MAX_BODY_BYTES, BodyLimit
from orchestrator.server.jobs import MAX_WAITING
from orchestrator.store import token_sql
from orchestrator.store.tables import Conversation
from tests.conftest import ROOT, worker_env
from tests.server.conftest import (
    CHORUS,
    Follower,
    Server,
    bearer,
    free_port,
    job_of_message,
    make_token,
    start_server,
)
from tests.server.test_auth import _approve, _waiting_job, revoked_stream_ended

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "last_event_id",
    [
        b"\xb2",  # SUPERSCRIPT TWO: str.isdigit() says yes, int() says no
        b"1" * 5000,  # past Python's int-from-text digit limit
        b"-1",
        b"1e3",
        str(2**63).encode(),
    ],
)
def test_a_bad_last_event_id_is_422_not_500(
    server: Server, acme: str, last_event_id: bytes
) -> None:
    headers = {**bearer(acme), "Last-Event-ID": last_event_id}
    for path in ("/v1/jobs/nope/events", "/v1/conversations/nope/events"):
        answer = httpx.get(f"{server.url}{path}", headers=headers, timeout=30)
        assert answer.status_code == 422, (path, answer.status_code, answer.text)
        assert answer.json()["fields"] == ["Last-Event-ID"]


def test_an_idempotency_key_cannot_reach_another_namespace(
    server: Server, client: Client, acme: str
) -> None:
    """A tenant named ``inbox`` whose key is ``<conversation>:<entry>`` must
    not get the job a queued message of another tenant started (the inbox
    keys its turns ``inbox:<conversation>:<entry>``)."""
    inbox = make_token(client, "inbox", "submit", "hostile")
    with httpx.Client(base_url=server.url, headers=bearer(acme), timeout=30) as victim:
        first = victim.post("/v1/jobs", json={"agent": "quick", "input": "victim"})
        assert first.status_code == 201, first.text
        conversation = first.json()["conversation_id"]
        victim.get(f"/v1/jobs/{first.json()['job_id']}/result", params={"wait": 20})
        sent = victim.post(f"/v1/conversations/{conversation}/messages", json={"text": "again"})
        victims_job = job_of_message(victim, conversation, sent)
        entry = sent.json()["entry_id"]
    with httpx.Client(base_url=server.url, headers=bearer(inbox), timeout=30) as hostile:
        answer = hostile.post(
            "/v1/jobs",
            json={"agent": "quick", "input": "mine", "idempotency_key": f"{conversation}:{entry}"},
        )
        assert answer.status_code == 201, answer.text
        assert answer.json()["job_id"] != victims_job
        assert answer.json()["conversation_id"] != conversation


@pytest.mark.parametrize("conversation_id", ["a\x00b", "\x00"])
def test_an_unstorable_event_filter_is_422_not_500(
    server: Server, acme: str, conversation_id: str
) -> None:
    with httpx.Client(base_url=server.url, headers=bearer(acme), timeout=30) as http:
        job = http.post("/v1/jobs", json={"agent": "quick", "input": "filtered"}).json()
        answer = http.get(
            f"/v1/runs/{job['job_id']}/events", params={"conversation_id": conversation_id}
        )
    assert answer.status_code == 422, answer.text
    assert answer.json()["fields"] == ["conversation_id"]


def test_another_tenant_reaches_no_run_view_or_subagent_conversation(
    server: Server, acme: str, globex: str
) -> None:
    with httpx.Client(base_url=server.url, headers=bearer(acme), timeout=30) as mine:
        job = mine.post("/v1/jobs", json={"agent": "small-fanout", "input": "tree"}).json()
        assert mine.get(f"/v1/jobs/{job['job_id']}/result", params={"wait": 30}).status_code == 200
        tree = mine.get(f"/v1/runs/{job['job_id']}").json()
        children = [c["conversation_id"] for c in tree["conversations"] if c["depth"] > 0]
        assert children
        sent = mine.post(f"/v1/conversations/{job['conversation_id']}/messages", json={"text": "x"})
        entry = sent.json()["entry_id"]
    jid, cid = job["job_id"], job["conversation_id"]
    with httpx.Client(base_url=server.url, headers=bearer(globex), timeout=30) as theirs:
        for path in (
            f"/v1/runs/{jid}",
            f"/v1/runs/{jid}/events",
            f"/v1/jobs/{jid}/usage",
            f"/v1/jobs/{jid}/output",
        ):
            answer = theirs.get(path)
            assert (answer.status_code, answer.json()["type"]) == (404, "JobNotFound"), path
        for conversation in (cid, *children):
            for answer in (
                theirs.get(f"/v1/conversations/{conversation}/usage"),
                theirs.get(f"/v1/conversations/{conversation}/messages"),
                theirs.get(f"/v1/conversations/{conversation}/events"),
                theirs.get(f"/v1/conversations/{conversation}/queue/{entry}"),
                theirs.post(f"/v1/conversations/{conversation}/fork"),
                theirs.post(f"/v1/conversations/{conversation}/messages", json={"text": "hi"}),
            ):
                assert answer.status_code == 404, (conversation, answer.text)
        assert jid not in theirs.get("/v1/runs", params={"tenant": "acme"}).text
        assert jid not in theirs.get("/v1/runs", params={"text": "tree"}).text
    # the dashboard, by globex's cookie, shows none of it either
    for page in (f"/dashboard/jobs/{jid}", f"/dashboard/jobs/{jid}/view"):
        answer = httpx.get(server.url + page, cookies={"chorus_token": globex}, timeout=30)
        assert answer.status_code == 404, (page, answer.status_code)
        assert "small-fanout" not in answer.text
    # and a cookie alone (no CSRF header) changes nothing
    answer = httpx.post(
        f"{server.url}/v1/jobs/{jid}/cancel", cookies={"chorus_token": acme}, timeout=30
    )
    assert answer.status_code == 403


def _threads(server: Server) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/task"))


def test_followers_that_left_keep_no_thread(server: Server, acme: str) -> None:
    with httpx.Client(base_url=server.url, headers=bearer(acme), timeout=30) as http:
        job = http.post("/v1/jobs", json={"agent": "travel-desk", "input": "wait"}).json()
        url = f"/v1/jobs/{job['job_id']}/events"
        try:
            before = _threads(server)
            for _ in range(20):
                with http.stream("GET", url) as answer:
                    for line in answer.iter_lines():
                        if line == "event: tool.approval_requested":
                            break
            # each follower's thread ends at its follow's next quiet period
            deadline = time.monotonic() + 30
            while _threads(server) >= before + 5 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert _threads(server) < before + 5
        finally:
            http.post(f"/v1/jobs/{job['job_id']}/cancel")


def test_a_body_over_the_cap_is_413_however_it_is_sent(server: Server, acme: str) -> None:
    huge = b'{"agent": "quick", "input": "' + b"x" * (MAX_BODY_BYTES + 1) + b'"}'

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked
        for start in range(0, len(huge), 65536):
            yield huge[start : start + 65536]

    with httpx.Client(base_url=server.url, headers=bearer(acme), timeout=30) as http:
        for body in (huge, chunks()):
            answer = http.post(
                "/v1/jobs", content=body, headers={"Content-Type": "application/json"}
            )
            assert answer.status_code == 413, answer.text
            assert answer.json()["message"].startswith("the request body is larger than")
        # and the server goes on: a body under the cap is a job
        made = http.post("/v1/jobs", json={"agent": "quick", "input": "x" * 1000})
        assert made.status_code == 201, made.text


def _until_waiting(answer: httpx.Response) -> None:
    for line in answer.iter_lines():
        if line == "event: tool.approval_requested":
            return
    raise AssertionError("the stream ended before the call waited")


@pytest.fixture
def capped(
    settings: Settings, workers: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Server]:
    """A server of its own (and the fleet) that serves at most two event streams."""
    monkeypatch.setenv("CHORUS_MAX_EVENT_STREAMS", "2")
    found = start_server(settings, tmp_path / "capped.log")
    try:
        yield found
    finally:
        found.proc.terminate()
        found.proc.wait(15)


def test_event_streams_past_the_cap_are_503_until_one_leaves(capped: Server, acme: str) -> None:
    # Given a server that serves at most two event streams
    with httpx.Client(base_url=capped.url, headers=bearer(acme), timeout=30) as http:
        job = http.post("/v1/jobs", json={"agent": "travel-desk", "input": "wait"}).json()
        url = f"/v1/jobs/{job['job_id']}/events"
        try:
            # When two follow a job that waits for a person
            with http.stream("GET", url) as one, http.stream("GET", url) as two:
                _until_waiting(one)
                _until_waiting(two)
                # Then a third is refused at once, as JSON
                third = http.get(url)
                assert third.status_code == 503, third.text
                assert third.json()["type"] == "ServiceUnavailableError"
            # And once they left (their threads end at a quiet period), one is served
            deadline = time.monotonic() + 30
            while True:
                with http.stream("GET", url) as again:
                    if again.status_code == 200:
                        break
                assert time.monotonic() < deadline, "the streams that left still count"
                time.sleep(0.5)
        finally:
            http.post(f"/v1/jobs/{job['job_id']}/cancel")


#: Event streams asked for at once of the capped server below.
BURST = 50


def test_a_burst_of_event_streams_cannot_pass_the_cap(capped: Server, acme: str) -> None:
    """The cap was checked when a stream was asked for but counted only once
    its follower thread ran: of 50 streams asked for at once, 17 were served."""
    # Given a job that waits for a person
    with httpx.Client(base_url=capped.url, headers=bearer(acme), timeout=30) as http:
        job = http.post("/v1/jobs", json={"agent": "travel-desk", "input": "burst"}).json()
    url = f"{capped.url}/v1/jobs/{job['job_id']}/events"

    async def burst() -> list[int]:
        go, answered = asyncio.Event(), asyncio.Event()
        codes: list[int] = []

        async def follow(http: httpx.AsyncClient) -> None:
            await go.wait()
            async with http.stream("GET", url) as got:
                codes.append(got.status_code)
                if len(codes) == BURST:
                    answered.set()
                await asyncio.wait_for(answered.wait(), 30)  # served ones stay open meanwhile

        limits = httpx.Limits(max_connections=None)
        async with httpx.AsyncClient(headers=bearer(acme), timeout=30, limits=limits) as http:
            followers = [asyncio.create_task(follow(http)) for _ in range(BURST)]
            await asyncio.sleep(0.2)  # every request ready, then all at once
            go.set()
            await asyncio.gather(*followers)
        return codes

    # When BURST streams of it are asked for at once of a server that serves two
    try:
        codes = asyncio.run(burst())
    finally:
        httpx.post(f"{url.removesuffix('/events')}/cancel", headers=bearer(acme), timeout=30)
    # Then two are served and every other one is refused
    assert sorted(codes) == [200] * 2 + [503] * (BURST - 2), codes


def test_a_body_that_never_ends_is_408_within_the_bound() -> None:
    """A chunked body sent a chunk at a time and never ended (slowloris)
    held its connection and request for good: uvicorn has no read timeout."""
    app = FastAPI()
    errors.install(app)

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    app.add_middleware(BodyLimit, within=0.3)
    sent: list[Message] = []

    async def one_chunk_then_nothing() -> Message:
        if not sent:
            sent.append({"type": "http.request", "body": b'{"a', "more_body": True})
            return sent[-1]
        await asyncio.Event().wait()  # the rest never comes
        raise AssertionError

    async def answered() -> list[Message]:
        out: list[Message] = []

        async def send(message: Message) -> None:
            out.append(message)

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "path": "/echo", "raw_path": b"/echo", "query_string": b"",
            "headers": [(b"transfer-encoding", b"chunked")], "scheme": "http",
            "server": ("t", 80), "client": ("c", 1), "root_path": "",
        }  # fmt: skip
        await asyncio.wait_for(app(scope, one_chunk_then_nothing, send), 5)
        return out

    started = time.monotonic()
    out = asyncio.run(answered())
    assert out[0]["status"] == 408
    assert json.loads(out[1]["body"])["message"].startswith("the request body did not arrive")
    assert time.monotonic() - started < 3


def test_revoked_tokens_lose_every_open_stream_and_cannot_resume(
    server: Server, client: Client, acme: str
) -> None:
    """Revocation once ended no stream already open: a token leaked and
    revoked (an admin's included) went on reading what it followed."""
    # Given a submit token and an admin token of another tenant, each with
    # many streams open: on a job that waits for a person and on one whose
    # events keep coming
    token = make_token(client, "acme", "submit", "leaked")
    admin = make_token(client, "ops", "admin", "leaked-admin")
    with httpx.Client(base_url=server.url, headers=bearer(acme), timeout=30) as http:
        waiting = http.post("/v1/jobs", json={"agent": "travel-desk", "input": "wait"}).json()
        busy = http.post("/v1/jobs", json={"agent": "four-tools", "input": "steps=39"}).json()
        try:
            followers = [
                Follower(server, who, path)
                for who in (token, token, token, admin)
                for path in (
                    f"/v1/jobs/{waiting['job_id']}/events",
                    f"/v1/conversations/{waiting['conversation_id']}/events",
                    f"/v1/jobs/{busy['job_id']}/events?deltas=true",
                    f"/v1/conversations/{busy['conversation_id']}/events",
                )
            ]
            for follower in followers:
                follower.wait_for("tool.started")
            following = _threads(server)  # a thread each, and the server's own

            # When both are revoked (what `chorus token revoke` runs)
            with client.runtime.session() as session:
                assert token_sql.revoke(session, token.split("_")[1]) == 1
                assert token_sql.revoke(session, admin.split("_")[1]) == 1
            revoked_at = time.monotonic()

            # Then every stream ends within the bound with the 401 body, the
            # busy job's while it still runs
            for follower in followers:
                revoked_stream_ended(follower, revoked_at)
            assert http.get(f"/v1/jobs/{busy['job_id']}").json()["status"] == "running"

            # And a reconnect, however it names where it left off, is a 401
            for who, follower in zip((token, admin), (followers[2], followers[-2]), strict=True):
                last = [f["id"] for f in follower.events() if "id" in f][-1]
                url = f"/v1/jobs/{busy['job_id']}/events"
                for resumed in (
                    httpx.get(server.url + url, headers={**bearer(who), "Last-Event-ID": last}),
                    httpx.get(
                        server.url + url, headers=bearer(who), params={"last_event_id": last}
                    ),
                    httpx.get(server.url + url, cookies={"chorus_token": who}),
                ):
                    assert resumed.status_code == 401, resumed.text
                    assert resumed.json()["type"] == "AuthenticationError"
                    assert resumed.headers["WWW-Authenticate"] == "Bearer"

            # And their follower threads end (at their follow's next quiet
            # period; a few threads of the server's pools may have started since)
            deadline = time.monotonic() + 30
            while _threads(server) > following - 10 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert _threads(server) <= following - 10
        finally:
            for job in (waiting, busy):
                http.post(f"/v1/jobs/{job['job_id']}/cancel")


def test_a_tenant_cannot_be_claimed_by_any_field_of_a_request(
    server: Server, client: Client, acme: str
) -> None:
    with httpx.Client(base_url=server.url, headers=bearer(acme), timeout=30) as http:
        # not as a field of the submit
        claimed = http.post("/v1/jobs", json={"agent": "quick", "input": "x", "tenant": "globex"})
        assert claimed.status_code == 422, claimed.text
        assert claimed.json()["fields"] == ["tenant"]
        # nor in the context_data of a submit or of a message sent later
        hostile = {"tenant": "globex", "x": 1}
        job = http.post(
            "/v1/jobs", json={"agent": "tenant-echo", "input": "one", "context_data": hostile}
        ).json()
        first = http.get(f"/v1/jobs/{job['job_id']}/result", params={"wait": 20}).json()
        conversation = job["conversation_id"]
        sent = http.post(
            f"/v1/conversations/{conversation}/messages",
            json={"text": "two", "context_data": hostile},
        )
        second = job_of_message(http, conversation, sent)
        later = http.get(f"/v1/jobs/{second}/result", params={"wait": 20}).json()
    for answer in (first, later):
        assert json.loads(answer["output"]) == {"tenant": "acme", "x": 1}
    with client.runtime.session() as session:
        root = session.get(Conversation, conversation)
        assert root is not None and root.tenant == "acme"


@pytest.mark.parametrize("keepalive", ["0", "-1", "nan"])
def test_a_server_refuses_a_keep_alive_that_is_not_a_positive_time(
    settings: Settings, keepalive: str, tmp_path: Path
) -> None:
    # A keep-alive of 0 made every result wait re-check its token in a
    # busy loop (1.8 s of CPU for a 3 s wait) and every stream send comments
    # without pause; a negative one answered a valid wait with a 422 about
    # a "timeout" the caller never gave.
    port = str(free_port())
    try:
        ran = subprocess.run(
            [*CHORUS, "server", "--port", port, "--keepalive", keepalive],
            cwd=ROOT,
            env=worker_env(settings),
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`chorus server --keepalive {keepalive}` started serving")
    assert ran.returncode == 2, ran.stderr
    assert "keepalive" in ran.stderr and "Traceback" not in ran.stderr


#: Result requests that wait at once in the attack below: more than the
#: threads of the server's shared pool (anyio's 40), which every route runs in.
WAITERS = 45


def test_result_waits_cannot_hold_every_thread_the_other_requests_need(
    server: Server, client: Client, acme: str
) -> None:
    # Given a job that waits for a person, and a reader asking 45 times at
    # once for its result, each waiting up to 5 s
    reader = make_token(client, "acme", "read", "many-waits")
    token, job = _waiting_job(server, client, "many-waits")
    answers: list[httpx.Response] = []

    def wait_for_the_result() -> None:
        with httpx.Client(base_url=server.url, headers=bearer(reader), timeout=30) as http:
            answers.append(http.get(f"/v1/jobs/{job['job_id']}/result", params={"wait": 5}))

    waiters = [threading.Thread(target=wait_for_the_result) for _ in range(WAITERS)]
    for waiter in waiters:
        waiter.start()
    time.sleep(1.0)
    try:
        # When another tenant's request arrives meanwhile
        with httpx.Client(base_url=server.url, headers=bearer(token), timeout=30) as http:
            began = time.monotonic()
            found = http.get(f"/v1/jobs/{job['job_id']}")
            took = time.monotonic() - began
        for waiter in waiters:
            waiter.join(30)
    finally:
        _approve(server, acme, job["conversation_id"])

    # Then it is answered at once, not when the waits end
    assert found.status_code == 200, found.text
    assert took < 2.0, f"a status request waited {took:.1f} s for a thread"
    # and the waits beyond the cap were refused at once, retryable
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [409] * MAX_WAITING + [503] * (WAITERS - MAX_WAITING), codes
    refused = next(answer for answer in answers if answer.status_code == 503)
    assert refused.json()["type"] == "ServiceUnavailableError"


def test_a_token_put_in_a_url_is_refused_and_kept_out_of_the_servers_log(
    server: Server, acme: str
) -> None:
    """uvicorn's access log printed each request's path and query: a client
    that put its token in the URL had it refused, and written to the log."""
    secret = acme.rsplit("_", 1)[1]
    for query in (f"token={acme}", f"access_token={acme}", f"t={acme}"):
        answer = httpx.get(f"{server.url}/v1/jobs?{query}", timeout=30)
        assert answer.status_code == 401, (query, answer.text)
    prefix = acme.rsplit("_", 1)[0]  # chorus_<prefix>: shown, as `chorus token list` does
    masked = [f"GET /v1/jobs?{q} " for q in ("token=***", "access_token=***", f"t={prefix}_***")]
    deadline = time.monotonic() + 10
    while not all(m in (log := server.log.read_text()) for m in masked):
        assert time.monotonic() < deadline, log[-2000:]  # the three requests, masked
        time.sleep(0.1)
    assert secret not in log
