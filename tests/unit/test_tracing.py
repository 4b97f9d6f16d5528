"""Tracing's values, and its off path: a job run with no OTLP endpoint set
loads neither the trace SDK nor an exporter (the spans themselves:
tests/integration/test_tracing.py). redis-py imports the SDK's metrics
itself when the SDK is installed; that is its own, at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.errors import InvalidRequestError
from orchestrator.tracing import JobTrace, provider_and_model
from tests.conftest import ROOT

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_traceparent_is_read_and_written_back() -> None:
    job = JobTrace.parse(CALLER)
    assert (job.trace_id, job.parent_id, job.sampled) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        True,
    )
    assert job.header() == CALLER
    assert not JobTrace.parse(CALLER[:-2] + "00").sampled


@pytest.mark.parametrize("value", [None, 12, "", CALLER + "-x", CALLER.replace("00-", "ff-", 1)])
def test_anything_else_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        JobTrace.parse(value, field="trace_parent")
    assert refused.value.fields == ["trace_parent"]


def test_provider_names_follow_the_genai_conventions() -> None:
    assert provider_and_model("openai/gpt-4o") == ("openai", "gpt-4o")
    assert provider_and_model("gpt-4o") == ("openai", "gpt-4o")
    assert provider_and_model("bedrock/anthropic.claude-3") == ("aws.bedrock", "anthropic.claude-3")
    assert provider_and_model("vertex_ai/gemini-pro") == ("gcp.vertex_ai", "gemini-pro")
    assert provider_and_model("anthropic/claude-3-5") == ("anthropic", "claude-3-5")


#: A job with a tool batch and a subagent, on the in-process harness, then
#: the OpenTelemetry modules it loaded.
RUN_A_JOB = """
import json, sys
SDK = ("opentelemetry.sdk.trace", "opentelemetry.exporter")
from orchestrator.testing import Harness
with Harness(modules=["tests.agents"]) as h:
    job = h.client.submit("traced-lead", "go")
    assert job.result().startswith("results:"), job.result()
print(json.dumps(sorted(m for m in sys.modules if m.startswith(SDK))))
"""


@pytest.mark.long
def test_with_no_endpoint_a_job_loads_no_trace_sdk() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONPATH=str(ROOT))
    out = subprocess.check_output(
        [sys.executable, "-c", RUN_A_JOB], cwd=ROOT, env=env, text=True, timeout=150
    )
    assert json.loads(out.strip().splitlines()[-1]) == []
