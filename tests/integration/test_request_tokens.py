"""The size of a model request is everything sent, and a checkpoint's call
is paid and admitted like a step's.

A tool-heavy agent sends little message text: its requests are the tool
schemas offered, the arguments of its calls and their structured results.
The context-token limit (checkpoints) and token rate limits count all of it.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

import litellm
import pytest
from sqlmodel import select

from orchestrator import Client, Job
from orchestrator.ratelimit import limit_key, request_tokens
from orchestrator.store.tables import CheckpointRow
from schemas import AgentSpec, EventName, RateLimit
from tests.loopback_llm import LoopbackLLM

pytestmark = pytest.mark.integration

LIMIT = 1000  # context tokens
ENTRIES = [
    f"2026-11-{i + 1:02d}; Acme Supplies Ltd; {100 + i},50 EUR; maintenance, invoice {9000 + i}"
    for i in range(16)
]
#: Usage the loopback server reports: the first step, the summarizer, the last step.
USAGE = [(101, 11), (777, 55), (51, 5)]


def _tool_heavy(server: LoopbackLLM, **options: Any) -> AgentSpec:
    return AgentSpec(
        name="bookkeeper",
        model="openai/loopback-model",
        system="Keep the books.",
        tools=("ledger",),
        model_settings={"api_base": server.base_url},
        **options,
    )


def _size(request: dict[str, Any]) -> int:
    return request_tokens(request["messages"], request.get("tools") or [])


def _is_summarizer(request: dict[str, Any]) -> bool:
    return "briefing" in str(request["messages"][0].get("content"))


@dataclass
class Run:
    job: Job
    requests: list[dict[str, Any]]
    window: dict[str, float]  # rate-limit window members (``<id>:r:<tokens>``) and scores


@pytest.fixture(scope="module")
def tool_heavy_run(client: Client, workers: Any) -> Run:
    """One turn: a call to ``ledger`` with large arguments and a large
    structured result, then an answer, under ``context_tokens=1000`` and a
    rate limit roomy enough never to defer."""
    limit = RateLimit(key=f"books-{uuid.uuid4().hex[:8]}", requests=100, tokens=10**6, period=60)
    with LoopbackLLM() as server:
        server.enqueue_tool_calls([("ledger", {"entries": ENTRIES})], usage=USAGE[0])
        server.enqueue_text("SUMMARY: 16 ledger entries were stored.", usage=USAGE[1])
        server.enqueue_text("done", usage=USAGE[2])
        agent = _tool_heavy(server, context_tokens=LIMIT, rate_limits=[limit])
        job = client.submit(agent, "Book these.")
        assert job.result(timeout=90) == "done"
        requests = server.requests
    rt = client.runtime
    key = limit_key(rt.settings.redis_prefix, limit, agent.model, {})
    entries = cast(list[tuple[str, float]], rt.redis.zrange(key, 0, -1, withscores=True))
    window = {str(member): score for member, score in entries}
    return Run(job, requests, window)


def test_a_tool_heavy_prompt_is_checkpointed_before_it_passes_the_context_limit(
    tool_heavy_run: Run,
) -> None:
    first, summarizer, last = tool_heavy_run.requests
    # The agent's second request would have been the first one's schema plus
    # the call's arguments and its structured result: over the limit, though
    # its message text alone is far under it.
    assert _is_summarizer(summarizer) and not _is_summarizer(last)
    assert ENTRIES[-1] in json.dumps(summarizer["messages"])
    assert ENTRIES[-1] not in json.dumps(last["messages"])
    # every request the agent sent stayed within the limit, by our count
    # and by OpenAI's tokenizer
    for request in (first, last):
        assert _size(request) <= LIMIT
        tokens = litellm.token_counter(
            model="gpt-4o", messages=request["messages"], tools=request.get("tools")
        )
        assert tokens <= LIMIT
    # the schema offered is counted: it is most of each request
    assert _size({"messages": [], "tools": first["tools"]}) > LIMIT // 4


def test_the_checkpoints_model_call_is_in_the_jobs_usage(tool_heavy_run: Run) -> None:
    status = tool_heavy_run.job.status()
    inputs, outputs = sum(u[0] for u in USAGE), sum(u[1] for u in USAGE)
    assert (status.usage.input_tokens, status.usage.output_tokens) == (inputs, outputs)
    assert (status.tree_usage.input_tokens, status.tree_usage.output_tokens) == (inputs, outputs)
    usage = [
        e.data
        for e in tool_heavy_run.job.events(deltas=False, timeout=5)
        if e.name is EventName.USAGE
    ]
    assert sorted(u["input_tokens"] for u in usage) == sorted(u[0] for u in USAGE)
    assert [u["output_tokens"] for u in usage if u.get("checkpoint")] == [USAGE[1][1]]


def test_the_checkpoints_model_call_is_admitted_by_the_rate_limit(tool_heavy_run: Run) -> None:
    # three calls admitted (step, checkpoint, step), each counted at the full
    # size of what it sent (the server may see a few bytes more or less)
    admitted = sorted(
        (score, int(member.rsplit(":", 1)[1]))
        for member, score in tool_heavy_run.window.items()
        if ":r:" in member
    )
    assert len(admitted) == 3
    for (_, counted), request in zip(admitted, tool_heavy_run.requests, strict=True):
        assert abs(counted - _size(request)) <= 0.05 * _size(request)


def test_a_token_rate_limit_admits_by_the_whole_request(client: Client, workers: Any) -> None:
    # Given an agent whose one-line requests are mostly its tool schema, under
    # a token limit that holds one request a window but not two
    with LoopbackLLM() as server:
        probe = request_tokens(
            [{"role": "system", "content": "Keep the books."}, {"role": "user", "content": "q"}]
        )
        for _ in range(2):
            server.enqueue_text("ok")
        agent = _tool_heavy(
            server,
            rate_limits=[RateLimit(key=f"books-{uuid.uuid4().hex[:8]}", tokens=500, period=2.0)],
        )
        # When two jobs ask at once
        jobs = [client.submit(agent, "q") for _ in range(2)]
        for job in jobs:
            assert job.result(timeout=60) == "ok"
        sizes = [_size(r) for r in server.requests]
    assert all(probe * 10 < size < 500 < 2 * size for size in sizes)
    # Then the second waited for the first to leave the window
    admitted = sorted(
        e.data["admitted_at"]
        for job in jobs
        for e in job.events(deltas=False, timeout=5)
        if e.name is EventName.LLM_REQUESTED
    )
    assert len(admitted) == 2
    assert admitted[1] - admitted[0] >= 2.0 - 0.01


def test_a_requested_checkpoint_waits_for_the_rate_limit(client: Client, workers: Any) -> None:
    # Given an agent allowed one model call every 5 s, and a finished turn
    limit = RateLimit(key=f"books-{uuid.uuid4().hex[:8]}", requests=1, period=5.0)
    with LoopbackLLM() as server:
        server.enqueue_text("noted")
        server.enqueue_text("SUMMARY: the user booked nothing yet.")
        agent = AgentSpec(
            name="bookkeeper",
            model="openai/loopback-model",
            model_settings={"api_base": server.base_url},
            rate_limits=[limit],
        )
        job = client.submit(agent, "Remember the ledger.")
        assert job.result(timeout=60) == "noted"

        # When a client asks for a checkpoint at once
        client.checkpoint(job.conversation_id)
        deadline = time.monotonic() + 60
        while not _checkpoints(client, job.conversation_id):
            assert time.monotonic() < deadline, "the requested checkpoint never completed"
            time.sleep(0.2)
        rt = client.runtime
        key = limit_key(rt.settings.redis_prefix, limit, agent.model, {})
        entries = cast(list[tuple[str, float]], rt.redis.zrange(key, 0, -1, withscores=True))
        assert server.pending == 0

    # Then its call waited for the window: admitted a period after the step's
    # (whose entry its admission dropped from the window)
    step = next(
        e.data["admitted_at"]
        for e in job.events(deltas=False, timeout=5)
        if e.name is EventName.LLM_REQUESTED
    )
    admitted = [score for member, score in entries if ":r:" in str(member)]
    assert len(admitted) == 1
    assert admitted[0] - step >= limit.period


def _checkpoints(client: Client, conversation_id: str) -> list[CheckpointRow]:
    with client.runtime.session() as s:
        query = select(CheckpointRow).where(CheckpointRow.conversation_id == conversation_id)
        return list(s.exec(query).all())
