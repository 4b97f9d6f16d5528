"""The model client's two paths behave as one.

``CHORUS_MODEL_CLIENT=auto`` streams OpenAI-protocol providers through the
openai SDK; ``litellm`` sends every call through litellm. The same cases run
on both paths, through :func:`complete`, against two real servers: the
loopback OpenAI-compatible server, and a LiteLLM proxy (``litellm --config``)
in front of it. The replies (text, thinking, tool calls with arguments
streamed across chunks, usage, cost) and the errors (``ModelError`` status
and retryability) must be equal.

The proxy needs ``litellm[proxy]``; it runs from ``CHORUS_TEST_LITELLM_PROXY``
(the path of a ``litellm`` executable, e.g. one in a venv of its own, since
the proxy extras pin versions the project does not use) or the ``litellm``
next to this Python. Without one the proxy cases are skipped, saying why.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from orchestrator import Client
from orchestrator.errors import ModelError
from orchestrator.llm.call import ModelReply, complete, model_path, tool_to_openai
from schemas import AgentSpec, EventName
from schemas.specs import ToolSpec
from tests.faults import free_port
from tests.loopback_llm import LoopbackLLM

PATHS = {"litellm": "litellm", "auto": "openai-sdk"}  # CHORUS_MODEL_CLIENT -> path taken
MODEL = "openai/gpt-4o"  # a model litellm prices; the servers answer whatever is asked
USER = [{"role": "user", "content": "Find the weather in Paris"}]
SEARCH = ToolSpec(
    name="search",
    description="Search the web",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)


@pytest.fixture(scope="module")
def server() -> Iterator[LoopbackLLM]:
    with LoopbackLLM() as loopback:
        yield loopback


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch, server: LoopbackLLM) -> Iterator[None]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("AZURE_API_KEY", "azure-test")
    yield
    assert server.pending == 0, "a case left responses queued"


def _unavailable(reason: str) -> NoReturn:
    """No proxy here: skip, unless CHORUS_TEST_LITELLM_PROXY names one (CI
    does), when its failing to start is a failure."""
    if os.environ.get("CHORUS_TEST_LITELLM_PROXY"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _proxy_executable() -> str | None:
    for candidate in (
        os.environ.get("CHORUS_TEST_LITELLM_PROXY"),
        str(Path(sys.executable).with_name("litellm")),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@pytest.fixture(scope="module")
def proxy(
    server: LoopbackLLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """A LiteLLM proxy serving ``gpt-4o`` from the loopback server: its base
    URL and its key (it refuses to start without one)."""
    executable = _proxy_executable()
    if executable is None:
        _unavailable("no litellm proxy executable (set CHORUS_TEST_LITELLM_PROXY)")
    folder = tmp_path_factory.mktemp("litellm-proxy")
    config = folder / "config.yaml"
    key = f"sk-{secrets.token_hex(32)}"
    config.write_text(
        "model_list:\n"
        "  - model_name: gpt-4o\n"
        "    litellm_params:\n"
        "      model: openai/loopback-model\n"
        f"      api_base: {server.base_url}\n"
        "      api_key: sk-upstream\n"
        "litellm_settings:\n"
        "  num_retries: 0\n"
        "  request_timeout: 30\n"
        "router_settings:\n"
        "  disable_cooldowns: true\n"
        "  num_retries: 0\n"
        "general_settings:\n"
        f"  master_key: {key}\n"
    )
    port = free_port()
    log = folder / "proxy.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_")}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
    process = subprocess.Popen(
        [executable, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_healthy(process, port, log)
        yield f"http://127.0.0.1:{port}/v1", key
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


def _wait_healthy(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.skip(f"the litellm proxy exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the litellm proxy never answered: {log.read_text()[-2000:]}")


@pytest.fixture(params=["loopback", "proxy", "azure"])
def target(
    request: pytest.FixtureRequest, server: LoopbackLLM, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, dict[str, Any]]:
    """(model, model_settings) of a server; every case runs against each."""
    if request.param == "proxy":
        base_url, key = request.getfixturevalue("proxy")
        monkeypatch.setenv("OPENAI_API_KEY", key)  # keys come from the environment
        return MODEL, {"api_base": base_url}
    if request.param == "azure":  # the Azure client and URL layout, on loopback
        base = server.base_url.removesuffix("/v1")
        return "azure/gpt-4o", {"api_base": base, "api_version": "2024-10-21"}
    return MODEL, {"api_base": server.base_url}


def _on_each_path(
    monkeypatch: pytest.MonkeyPatch,
    target: tuple[str, dict[str, Any]],
    prepare: Any,
    **kwargs: Any,
) -> dict[str, ModelReply | ModelError]:
    """Run one case on each path: ``prepare()`` queues the server's answer."""
    model, settings = target
    tools = kwargs.pop("tools", None)
    outcomes: dict[str, ModelReply | ModelError] = {}
    for choice, expected in PATHS.items():
        monkeypatch.setenv("CHORUS_MODEL_CLIENT", choice)
        assert model_path(model, settings) == expected
        prepare()
        try:
            outcomes[choice] = complete(model, USER, tools, settings, **kwargs)
        except ModelError as exc:
            outcomes[choice] = exc
    return outcomes


def test_text_thinking_usage_and_cost_are_the_same(
    monkeypatch: pytest.MonkeyPatch, server: LoopbackLLM, target: tuple[str, dict[str, Any]]
) -> None:
    deltas: list[str] = []

    def prepare() -> None:
        server.enqueue_text("It is sunny in Paris today.", usage=(42, 7), reasoning="Weather: so")

    replies = _on_each_path(monkeypatch, target, prepare, on_delta=deltas.append)

    sdk, litellm = replies["auto"], replies["litellm"]
    assert isinstance(sdk, ModelReply) and sdk == litellm
    assert sdk.text == "It is sunny in Paris today."
    assert (sdk.usage.input_tokens, sdk.usage.output_tokens) == (42, 7)
    assert sdk.usage.cost_usd > 0  # gpt-4o, priced by litellm on both paths
    assert sdk.finish_reason == "stop"
    assert sdk.thinking == "Weather: so"
    assert "".join(deltas) == sdk.text * 2 and len(deltas) > 4


def test_streamed_tool_calls_are_the_same(
    monkeypatch: pytest.MonkeyPatch, server: LoopbackLLM, target: tuple[str, dict[str, Any]]
) -> None:
    def prepare() -> None:
        server.enqueue_tool_calls(
            [
                {"name": "search", "arguments": {"q": "Paris weather, hourly"}, "id": "call_a"},
                {"name": "search", "arguments": {"q": "Paris news"}, "id": "call_b"},
                {"name": "lookup", "arguments": "{broken", "id": "call_c"},
            ],
            text="Let me look.",
        )

    replies = _on_each_path(monkeypatch, target, prepare, tools=[tool_to_openai(SEARCH)])

    sdk, litellm = replies["auto"], replies["litellm"]
    assert isinstance(sdk, ModelReply) and sdk == litellm
    assert sdk.text == "Let me look."
    assert [(c.tool_request_id, c.tool, c.params) for c in sdk.tool_calls] == [
        ("call_a", "search", {"q": "Paris weather, hourly"}),  # arguments came in 3 chunks
        ("call_b", "search", {"q": "Paris news"}),
        ("call_c", "lookup", {"__invalid_arguments__": "{broken"}),
    ]
    assert sdk.usage.output_tokens > 0 and sdk.usage.cost_usd > 0


@pytest.mark.parametrize(
    ("status", "retryable"), [(400, False), (401, False), (429, True), (500, True)]
)
def test_http_errors_are_the_same_model_error(
    monkeypatch: pytest.MonkeyPatch,
    server: LoopbackLLM,
    target: tuple[str, dict[str, Any]],
    status: int,
    retryable: bool,
) -> None:
    errors = _on_each_path(
        monkeypatch, target, lambda: server.enqueue_error(status, message="loopback says no")
    )

    for error in errors.values():
        assert isinstance(error, ModelError)
        assert (error.status, error.retryable) == (status, retryable)
        assert "loopback says no" in (error.body or "")


def test_cancellation_closes_the_stream_on_both_paths(
    monkeypatch: pytest.MonkeyPatch, server: LoopbackLLM, target: tuple[str, dict[str, Any]]
) -> None:
    words = " ".join(f"w{i}" for i in range(60))
    seen: list[str] = []

    def prepare() -> None:
        seen.clear()
        server.enqueue_text(words, chunk_delay=0.05)  # 3 s if read to the end

    began = time.monotonic()
    replies = _on_each_path(
        monkeypatch, target, prepare, on_delta=seen.append, should_stop=lambda: len(seen) >= 2
    )

    for reply in replies.values():
        assert isinstance(reply, ModelReply)
        assert reply.stopped and reply.text == "w0 w1 " and reply.tool_calls == []
    assert time.monotonic() - began < 5  # neither call read its stream to the end


@pytest.mark.parametrize("path", list(PATHS))
def test_transport_failures_have_no_status_and_are_retryable(
    monkeypatch: pytest.MonkeyPatch, server: LoopbackLLM, path: str
) -> None:
    monkeypatch.setenv("CHORUS_MODEL_CLIENT", path)
    refused = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ModelError) as caught:
        complete(MODEL, USER, None, {"api_base": refused})
    assert (caught.value.status, caught.value.retryable) == (None, True)

    server.enqueue_text("too slow", chunk_delay=1.0)
    with pytest.raises(ModelError) as caught:
        complete(MODEL, USER, None, {"api_base": server.base_url, "timeout": 0.2})
    assert (caught.value.status, caught.value.retryable) == (None, True)
    time.sleep(1.2)  # let the loopback finish writing to the closed socket


def test_model_settings_reach_the_request_the_same_way(
    monkeypatch: pytest.MonkeyPatch, server: LoopbackLLM
) -> None:
    settings = {
        "api_base": server.base_url,
        "max_tokens": 50,
        "temperature": 0.3,
        "seed": 7,
        "extra_headers": {"X-Trace": "abc"},
        "extra_body": {"top_k": 5},
        "custom_provider_knob": "on",  # unknown to litellm: sent in the body
        "input_cost_per_token": 0.001,  # litellm-only: priced, never sent
        "output_cost_per_token": 0.002,
    }
    sent: dict[str, tuple[Any, str | None]] = {}
    replies: dict[str, ModelReply] = {}
    for choice, expected in PATHS.items():
        monkeypatch.setenv("CHORUS_MODEL_CLIENT", choice)
        assert model_path("openai/priced-loopback", settings) == expected
        server.enqueue_text("ok", usage=(10, 10))
        replies[choice] = complete("openai/priced-loopback", USER, None, settings)
        request = server.received[-1]
        sent[choice] = (request.body, request.headers.get("X-Trace"))

    assert sent["auto"] == sent["litellm"]
    body, header = sent["auto"]
    assert header == "abc"
    assert {k: body[k] for k in ("max_tokens", "temperature", "seed", "top_k")} == {
        "max_tokens": 50,
        "temperature": 0.3,
        "seed": 7,
        "top_k": 5,
    }
    assert body["custom_provider_knob"] == "on" and "input_cost_per_token" not in body
    assert (
        replies["auto"].usage.cost_usd == replies["litellm"].usage.cost_usd == pytest.approx(0.03)
    )


def test_litellm_only_settings_keep_the_call_on_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORUS_MODEL_CLIENT", "auto")
    settings = {"mock_response": "mocked by litellm"}

    assert model_path(MODEL, settings) == "litellm"
    assert complete(MODEL, USER, None, settings).text == "mocked by litellm"
    assert model_path("scripted/anything", {}) == "litellm"
    assert model_path("anthropic/claude-3-5-sonnet", {}) == "litellm"
    assert model_path("ollama_chat/llama3", {}) == "litellm"  # Ollama's own protocol


@pytest.mark.integration
def test_a_job_streams_few_coalesced_deltas(
    client: Client, workers: Any, server: LoopbackLLM
) -> None:
    # Given a model that streams 40 words over about 1.2 s
    words = " ".join(f"w{i}" for i in range(40))
    server.enqueue_text(words, chunk_delay=0.03)
    agent = AgentSpec(
        name="streamer", model="openai/loopback-model", model_settings={"api_base": server.base_url}
    )

    # When a job runs it
    job = client.submit(agent, "talk")
    events = list(job.events(timeout=60))

    # Then the live deltas carry the whole text in far fewer events than chunks
    deltas = [e.data["text"] for e in events if e.name is EventName.ASSISTANT_DELTA]
    assert "".join(deltas) == words == job.result(timeout=5)
    assert 1 <= len(deltas) < 20
