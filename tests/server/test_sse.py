"""Live events over HTTP as Server-Sent Events: replay, follow, resume."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from orchestrator import Client, Settings
from orchestrator.errors import AuthenticationError, ChorusError, ServiceUnavailableError
from orchestrator.server.revocations import Revocations
from orchestrator.store import token_sql
from schemas import TurnStatus
from tests.approval_agents import stored_events
from tests.server.conftest import job_of_message, sse

pytestmark = pytest.mark.integration


def _stored(client: Client, job_id: str) -> list[tuple[int, str]]:
    return [(e.seq or 0, e.name.value) for e in client.job(job_id).events(deltas=False)]


def _events(frames: Iterator[dict[str, str]]) -> Iterator[dict[str, str]]:
    return (f for f in frames if "comment" not in f)


def test_a_stream_replays_the_stored_events_and_ends(api: httpx.Client, client: Client) -> None:
    job = api.post("/v1/jobs", json={"agent": "quick", "input": "stream me"}).json()
    with api.stream("GET", f"/v1/jobs/{job['job_id']}/events") as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        frames = list(_events(sse(answer.iter_lines())))
    assert frames[-1]["event"] == "end"
    got = [(int(f["id"]), f["event"]) for f in frames[:-1]]
    assert got == _stored(client, job["job_id"])
    assert got[-1][1] == "turn.completed"
    assert json.loads(frames[0]["data"])["name"] == got[0][1]


def test_a_follower_that_reconnects_gets_exactly_the_rest(
    api: httpx.Client, client: Client
) -> None:
    # Given a turn whose tools take seconds, followed live until its tools start
    job = api.post("/v1/jobs", json={"agent": "slow-batch", "input": "slowly"}).json()
    url = f"/v1/jobs/{job['job_id']}/events"
    before: list[tuple[int, str]] = []
    keepalives = 0
    with api.stream("GET", url) as answer:
        for frame in sse(answer.iter_lines()):
            if "comment" in frame:
                keepalives += 1  # the tools run for seconds without an event
                continue
            before.append((int(frame["id"]), frame["event"]))
            if frame["event"] == "tool.started":
                break  # the connection drops mid-turn

    # When it reconnects with the last id it saw (deltas asked for this time)
    after: list[tuple[int, str]] = []
    headers = {"Last-Event-ID": str(before[-1][0])}
    with api.stream("GET", url, headers=headers, params={"deltas": "true"}) as answer:
        for frame in _events(sse(answer.iter_lines())):
            if frame["event"] == "assistant.delta":
                assert "id" not in frame  # live only: never resumed to
            elif frame["event"] != "end":
                after.append((int(frame["id"]), frame["event"]))

    # Then the two parts are the whole stored stream: none twice, none missing
    assert before + after == _stored(client, job["job_id"])
    assert after[-1][1] == "turn.completed"
    assert keepalives >= 1
    # deltas are live only: a reconnect that lands after the answer streamed
    # sees none (seen under load), so their count is not asserted here

    # And a client without headers resumes with the query parameter
    with api.stream("GET", url, params={"last_event_id": before[-1][0]}) as answer:
        rest = [(int(f["id"]), f["event"]) for f in _events(sse(answer.iter_lines())) if "id" in f]
    assert rest == after


def test_a_conversation_stream_covers_every_turn_of_its_tree(
    api: httpx.Client, client: Client
) -> None:
    first = api.post("/v1/jobs", json={"agent": "quick", "input": "one"}).json()
    api.get(f"/v1/jobs/{first['job_id']}/result", params={"wait": 20})
    conversation = first["conversation_id"]
    sent = api.post(f"/v1/conversations/{conversation}/messages", json={"text": "two"})
    second = job_of_message(api, conversation, sent)
    with api.stream("GET", f"/v1/conversations/{conversation}/events") as answer:
        frames = [f for f in _events(sse(answer.iter_lines())) if "id" in f]
    names = [f["event"] for f in frames]
    assert names.count("turn.completed") == 2
    seqs = [int(f["id"]) for f in frames]
    assert seqs == sorted(set(seqs))
    assert set(_stored(client, second)) <= set(zip(seqs, names, strict=True))
    assert set(_stored(client, first["job_id"])) <= set(zip(seqs, names, strict=True))


def _ids_and_names(frames: Iterator[dict[str, str]]) -> list[tuple[int, str]]:
    return [(int(f["id"]), f["event"]) for f in _events(frames) if "id" in f]


def test_a_tree_stream_resumed_mid_run_gets_exactly_the_rest(
    api: httpx.Client, client: Client
) -> None:
    # Given a job whose subagents (three, one with a subagent of its own)
    # run for seconds, its conversation's stream read until the first event
    # of a subagent's conversation, then dropped
    job = api.post("/v1/jobs", json={"agent": "lead", "input": "research"}).json()
    root = job["conversation_id"]
    url = f"/v1/conversations/{root}/events"
    before: list[tuple[int, str]] = []
    with api.stream("GET", url) as answer:
        for frame in _events(sse(answer.iter_lines())):
            before.append((int(frame["id"]), frame["event"]))
            if json.loads(frame["data"])["conversation_id"] != root:
                break
    assert client.job(job["job_id"]).status().status is TurnStatus.RUNNING

    # When it reconnects with the last id it saw, and reads to the end
    resumed = {"Last-Event-ID": str(before[-1][0])}
    with api.stream("GET", url, headers=resumed) as answer:
        after = _ids_and_names(sse(answer.iter_lines()))

    # Then the two parts are the whole tree's stream, as a full replay after
    # the job ended gives it and as it is stored: none twice, none missing
    with api.stream("GET", url) as answer:
        replay = _ids_and_names(sse(answer.iter_lines()))
    assert before + after == replay
    stored = stored_events(client, client.job(job["job_id"]))
    assert replay == [(e.seq, e.name.value) for e in stored]
    assert len({e.conversation_id for e in stored}) == 5  # the root and four subagents
    assert (stored[-1].conversation_id, stored[-1].name.value) == (root, "turn.completed")


def test_a_bad_last_event_id_is_refused(api: httpx.Client) -> None:
    job = api.post("/v1/jobs", json={"agent": "quick", "input": "x"}).json()
    answer = api.get(f"/v1/jobs/{job['job_id']}/events", headers={"Last-Event-ID": "abc"})
    assert answer.status_code == 422
    assert answer.json()["fields"] == ["Last-Event-ID"]


def _ended_by(client: Client, token_id: str) -> ChorusError | None:
    """What one check of the open streams' tokens ends a stream of ``token_id`` with."""

    async def once() -> ChorusError | None:
        watch = Revocations(client, every=1.0)
        with watch.watching(token_id) as ended:
            await watch.check()
            return ended.result() if ended.done() else None

    return asyncio.run(once())


def test_a_stream_whose_token_is_gone_or_cannot_be_checked_ends(
    client: Client, settings: Settings, acme: str
) -> None:
    with client.runtime.session() as session:
        principal = token_sql.verify(session, acme)
    assert principal is not None
    # a valid token's stream goes on; one whose token is gone (deleted) ends, 401
    assert _ended_by(client, principal.token_id) is None
    assert isinstance(_ended_by(client, "no-such-token"), AuthenticationError)
    # and when Postgres cannot be reached, nothing is served unchecked: 503
    away = settings.model_copy(
        update={"database_url": "postgresql+psycopg://postgres@127.0.0.1:9/away"}
    )
    unreachable = Client(away)
    try:
        ended = _ended_by(unreachable, principal.token_id)
    finally:
        unreachable.close()
    assert isinstance(ended, ServiceUnavailableError)
    assert "checking the token failed" in str(ended)
