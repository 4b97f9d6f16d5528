"""Where a model call goes is the workers' configuration: an inline spec
(one a job supplies) names a model and how it samples, never an endpoint,
a key, a price or a route, unless CHORUS_MODEL_ENDPOINTS lists the
endpoint. A registered agent may name any endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator import Agent, Client, SettingNotAllowedError, Settings, UserError
from orchestrator.spec_checks import check_inline
from schemas import AgentSpec
from tests.loopback_llm import LoopbackLLM

pytestmark = pytest.mark.integration

MODEL = "openai/loopback-model"


@pytest.fixture
def listener() -> Iterator[LoopbackLLM]:
    with LoopbackLLM() as server:
        server.enqueue_text("ok")
        yield server


@pytest.fixture(scope="module")
def strict(settings: Settings) -> Iterator[Client]:
    """A client with the default rule: no endpoint listed."""
    client = Client(settings.model_copy(update={"model_endpoints": []}))
    yield client
    client.close()


def _refused(url: str) -> list[tuple[dict[str, Any], str]]:
    """(spec fields, refused field) of inline specs that would send a call to ``url``."""
    return [
        ({"model_settings": {"api_base": url}}, "model_settings.api_base"),
        ({"model_settings": {"base_url": url}}, "model_settings.base_url"),
        ({"model": f"huggingface/{url}"}, "model"),
        (
            {"model_settings": {"aws_bedrock_runtime_endpoint": url}},
            "model_settings.aws_bedrock_runtime_endpoint",
        ),
        (
            {"model_settings": {"fallbacks": [{"model": MODEL, "api_base": url}]}},
            "model_settings.fallbacks",
        ),
        (
            {"model_settings": {"custom_llm_provider": "openai"}},
            "model_settings.custom_llm_provider",
        ),
        ({"model_settings": {"extra_headers": {"Host": "x"}}}, "model_settings.extra_headers"),
        ({"model_settings": {"extra_body": {"a": 1}}}, "model_settings.extra_body"),
        ({"model_settings": {"input_cost_per_token": 0.0}}, "model_settings.input_cost_per_token"),
        ({"model_settings": {"vertex_project": "theirs"}}, "model_settings.vertex_project"),
        ({"model_settings": {"api_version": "1&x=y"}}, "model_settings.api_version"),
    ]


def test_an_inline_spec_naming_an_endpoint_is_refused_and_nothing_is_sent(
    strict: Client, workers: Any, listener: LoopbackLLM
) -> None:
    for fields, path in _refused(listener.base_url):
        spec = AgentSpec(**{"name": "sec-endpoint", "model": MODEL, **fields})
        with pytest.raises(SettingNotAllowedError) as caught:
            strict.submit(spec, "hi")
        assert isinstance(caught.value, UserError)
        assert caught.value.fields == [path], fields
        assert path in str(caught.value)
    # The workers are up: a job accepted above would have reached the listener
    ordinary = strict.submit(AgentSpec(name="sec-ordinary", model="scripted/quick"), "hi")
    assert ordinary.result(timeout=60) == "ok: hi"
    assert listener.received == []


def test_a_listed_endpoint_is_accepted_and_no_other(
    settings: Settings, workers: Any, listener: LoopbackLLM
) -> None:
    # Given endpoints listed by port and path
    base = listener.base_url  # http://127.0.0.1:PORT/v1
    listed = Client(settings.model_copy(update={"model_endpoints": [base]}))
    try:
        port = int(base.split(":")[2].split("/")[0])
        for other in (
            base.replace(f":{port}/", f":{port + 1}/"),
            base.replace("/v1", "/v10"),
            base.replace("127.0.0.1", "localhost"),
            base.replace("http://", "https://"),
            base.replace("/v1", "/v1/../admin"),
        ):
            spec = AgentSpec(name="sec-listed", model=MODEL, model_settings={"api_base": other})
            with pytest.raises(SettingNotAllowedError):
                listed.submit(spec, "hi")
        # The listed endpoint runs, with ordinary settings beside it
        spec = AgentSpec(
            name="sec-listed",
            model=MODEL,
            model_settings={"api_base": f"{base}/", "temperature": 0.1, "max_tokens": 20},
        )
        assert listed.submit(spec, "hi").result(timeout=60) == "ok"
    finally:
        listed.close()
    assert [r.path for r in listener.received] == ["/v1/chat/completions"]


def test_a_registered_agent_may_name_any_endpoint(
    strict: Client, workers: Any, listener: LoopbackLLM
) -> None:
    # Given an agent declared (worker-side) with an endpoint and a price
    declared = Agent(
        "sec-registered-endpoint",
        MODEL,
        model_settings={"api_base": listener.base_url, "input_cost_per_token": 0.0},
    )
    # A copy that differs is an inline spec: refused
    changed = declared.model_copy(update={"system": "Say more."})
    with pytest.raises(SettingNotAllowedError):
        strict.submit(changed, "hi")
    # The agent itself runs, by name or as its spec
    assert strict.submit("sec-registered-endpoint", "hi").result(timeout=60) == "ok"
    listener.enqueue_text("again")
    assert strict.submit(declared, "hi").result(timeout=60) == "again"
    assert len(listener.received) == 2


def test_an_inline_model_of_a_local_provider_needs_a_listed_endpoint(
    settings: Settings, strict: Client, workers: Any, listener: LoopbackLLM
) -> None:
    # ollama/x posted to localhost:11434 and llamafile/x to 127.0.0.1:8080
    # from the worker, and the body that answered came back in the job's error
    for model in ("ollama/x", "ollama_chat/x", "llamafile/x", "lemonade/x", "xinference/x"):
        with pytest.raises(SettingNotAllowedError) as caught:
            strict.submit(AgentSpec(name="sec-local", model=model), "hi")
        assert caught.value.fields == ["model"], model
    # With a listed endpoint the operator chose, the model is the job's choice
    listed = Client(settings.model_copy(update={"model_endpoints": [listener.base_url]}))
    try:
        spec = AgentSpec(
            name="sec-local",
            model="llamafile/loopback-model",
            model_settings={"api_base": listener.base_url},
        )
        assert listed.submit(spec, "hi").result(timeout=60) == "ok"
    finally:
        listed.close()
    assert [r.path for r in listener.received] == ["/v1/chat/completions"]


def test_an_inline_model_string_cannot_walk_out_of_its_path(
    strict: Client, workers: Any, listener: LoopbackLLM
) -> None:
    # The Azure path puts the model in the URL: "azure/../../../admin/x?y="
    # posted to <AZURE_API_BASE>/admin/x with the workers' key ("#" cut the rest)
    for model in (
        "azure/../../../admin/x?y=",
        "azure/a#b",
        "azure/a%2f..%2fb",
        "azure/a\\b",
        "openai/./x",
    ):
        with pytest.raises(SettingNotAllowedError) as caught:
            strict.submit(AgentSpec(name="sec-path", model=model), "hi")
        assert caught.value.fields == ["model"], model
    # ordinary model names pass (versions, colons, dots, slashes)
    for model in ("scripted/quick", "bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0"):
        check_inline(AgentSpec(name="sec-path", model=model), [])
    assert listener.received == []


def test_an_inline_spec_over_the_size_bound_is_refused(strict: Client) -> None:
    # Given an inline spec whose system prompt alone is 1,000,001 characters
    spec = AgentSpec(name="huge", model="scripted/ok", system="x" * 1_000_001)
    # Then submit refuses it naming the agent: it would be stored and sent every step
    with pytest.raises(UserError) as caught:
        strict.submit(spec, "hi")
    assert caught.value.fields == ["agent"]
    assert "1,000,000 characters" in str(caught.value)
