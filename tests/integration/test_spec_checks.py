"""Everything an agent spec names or carries is checked when it is declared
or submitted: credentials in model_settings, unknown transformers and
checkpoint strategies, rate-limit key templates."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import Agent, Client, InvalidRequestError, UserError, registry
from orchestrator.errors import SecretInSettingsError
from orchestrator.llm.scripted import scripted_model
from schemas import AgentSpec, RateLimit

pytestmark = pytest.mark.integration

REFUSED = [
    ({"api_key": "sk-live"}, "model_settings.api_key"),
    ({"API_KEY": "sk-live"}, "model_settings.API_KEY"),
    ({"api_base": "https://user:pass@llm.example.com/v1"}, "model_settings.api_base"),
    ({"base_url": "https://llm.example.com/v1?api_key=sk"}, "model_settings.base_url"),
    ({"aws_access_key_id": "AKIA"}, "model_settings.aws_access_key_id"),
    ({"aws_secret_access_key": "x"}, "model_settings.aws_secret_access_key"),
    ({"aws_session_token": "x"}, "model_settings.aws_session_token"),
    ({"aws_role_name": "admin"}, "model_settings.aws_role_name"),
    ({"vertex_credentials": "{}"}, "model_settings.vertex_credentials"),
    ({"azure_ad_token": "x"}, "model_settings.azure_ad_token"),
    ({"azure_ad_token_provider": "x"}, "model_settings.azure_ad_token_provider"),
    ({"client_secret": "x"}, "model_settings.client_secret"),
    (
        {"extra_headers": {"Authorization": "Bearer x"}},
        "model_settings.extra_headers.Authorization",
    ),
    ({"headers": {"api-key": "x"}}, "model_settings.headers.api-key"),
    ({"headers": {"X-Api-Key": "x"}}, "model_settings.headers.X-Api-Key"),
    ({"extra_body": {"nested": [{"token": "x"}]}}, "model_settings.extra_body.nested.0.token"),
]

ACCEPTED: list[dict[str, Any]] = [
    {"max_tokens": 100},
    {"max_completion_tokens": 100},
    {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0},
    {"temperature": 0.2, "top_p": 0.9, "seed": 1, "stop": ["\n\n"], "timeout": 30},
    {"api_base": "http://127.0.0.1:9/v1", "api_version": "2024-06-01"},
    {"aws_region_name": "eu-west-1"},
    {"extra_headers": {"X-Request-Source": "chorus"}},
    {"reasoning_effort": "low", "thinking": {"type": "enabled", "budget_tokens": 1024}},
]


@pytest.mark.parametrize(("model_settings", "path"), REFUSED)
def test_credentials_in_model_settings_are_refused_by_name(
    client: Client, model_settings: dict[str, Any], path: str
) -> None:
    # At declaration
    with pytest.raises(SecretInSettingsError) as declared:
        Agent("sec-leaky", scripted_model("quick"), model_settings=model_settings)
    assert declared.value.fields == [path] and path in str(declared.value)
    # And at submit, inline
    spec = AgentSpec(name="sec-leaky", model=scripted_model("quick"), model_settings=model_settings)
    with pytest.raises(SecretInSettingsError) as submitted:
        client.submit(spec, "hi")
    assert isinstance(submitted.value, UserError)
    assert submitted.value.fields == [path]


@pytest.mark.parametrize("model_settings", ACCEPTED)
def test_ordinary_litellm_parameters_are_accepted(model_settings: dict[str, Any]) -> None:
    name = f"sec-ordinary-{ACCEPTED.index(model_settings)}"
    spec = Agent(name, scripted_model("quick"), model_settings=model_settings)
    assert spec.model_settings == model_settings


def test_ordinary_parameters_reach_a_real_run(client: Client, workers: Any) -> None:
    spec = AgentSpec(
        name="sec-tokens",
        model=scripted_model("quick"),
        model_settings={"max_tokens": 50, "max_completion_tokens": 50},
    )
    assert client.submit(spec, "hello").result(timeout=60) == "ok: hello"


def _key(template: str) -> dict[str, Any]:
    return {"rate_limits": (RateLimit(key=template, requests=1),)}


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"context": ("checkpoint", "nope")}, "context", "unknown context transformer 'nope'"),
        ({"checkpoint_strategy": "nope"}, "checkpoint_strategy", "unknown checkpoint strategy"),
        (
            _key("{tenant"),
            "rate_limits.0.key",
            "malformed",
        ),
        (
            _key("t:{tenant[0]}"),
            "rate_limits.0.key",
            "only",
        ),
        (
            _key("{tenant.upper}"),
            "rate_limits.0.key",
            "only",
        ),
        (_key("{tenant!r}"), "rate_limits.0.key", "only"),
        (_key("{tenant:>9}"), "rate_limits.0.key", "only"),
        (_key("{}"), "rate_limits.0.key", "only"),
        (_key("a}b"), "rate_limits.0.key", "malformed"),
    ],
)
def test_a_spec_that_would_fail_every_step_is_refused_at_submit(
    client: Client, changes: dict[str, Any], field: str, message: str
) -> None:
    spec = AgentSpec(name="sec-broken", model=scripted_model("quick"), **changes)
    with pytest.raises(InvalidRequestError, match=message) as caught:
        client.submit(spec, "hi")
    assert caught.value.fields == [field]


def test_a_malformed_key_template_is_refused_when_the_agent_is_declared() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Agent(
            "sec-bad-key",
            scripted_model("quick"),
            rate_limits=[RateLimit(key="tenant:{tenant[0]}", requests=1)],
        )
    assert caught.value.fields == ["rate_limits.0.key"]


def test_a_subagent_with_an_unknown_transformer_is_refused_at_submit(client: Client) -> None:
    child = AgentSpec(name="sec-bad-child", model=scripted_model("quick"), context=("nope",))
    registry.register_agent(child)
    lead = AgentSpec(name="sec-lead", model=scripted_model("quick"), subagents=(child.name,))
    with pytest.raises(InvalidRequestError, match="'sec-bad-child' names an unknown context"):
        client.submit(lead, "hi")


def test_an_invalid_agent_declaration_names_the_field() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Agent("not a name", scripted_model("quick"), max_steps=0)
    assert set(caught.value.fields) == {"name", "max_steps"}


def test_an_invalid_inline_spec_as_data_names_the_field(client: Client) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        client.submit({"name": "x y", "model": "m"}, "hi")  # type: ignore[arg-type]
    assert any(f.startswith("agent") and f.endswith("name") for f in caught.value.fields)
