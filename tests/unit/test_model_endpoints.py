"""An inline spec's endpoint must be under one CHORUS_MODEL_ENDPOINTS lists,
and read the same way by every URL parser (orchestrator.spec_checks)."""

from __future__ import annotations

import pytest

from orchestrator.spec_checks import endpoint_listed

ENDPOINTS = ["http://127.0.0.1", "https://llm.internal:8443/v1"]


@pytest.mark.parametrize(
    ("url", "listed"),
    [
        ("http://127.0.0.1:9000/v1", True),
        ("http://127.0.0.1/", True),
        ("https://llm.internal:8443/v1", True),
        ("https://llm.internal:8443/v1/", True),
        ("https://llm.internal:8443/v1/deployments/x", True),
        ("https://llm.internal/v1", False),
        ("https://llm.internal:8444/v1", False),
        ("https://llm.internal:8443/v10", False),
        ("https://llm.internal:8443/", False),
        ("http://llm.internal:8443/v1", False),
        ("https://llm.internal:8443/v1/../admin", False),
        ("https://llm.internal:8443/v1/./x", False),
        ("https://llm.internal:8443/v1/%2e%2e/admin", False),
        ("https://llm.internal:8443/v1?x=1", False),
        ("http://127.0.0.1@anyone.example/v1", False),
        ("http://anyone.example\\@127.0.0.1/v1", False),
        ("http://127.0.0.1.anyone.example/v1", False),
        ("http://localhost:9000/v1", False),
        ("http://127.0.0.1:99999/v1", False),
        ("http://127.0.0.1 /v1", False),
        ("ftp://127.0.0.1/v1", False),
        ("127.0.0.1:9000/v1", False),
        ("", False),
    ],
)
def test_an_endpoint_is_listed_only_under_an_entry(url: str, listed: bool) -> None:
    assert endpoint_listed(url, ENDPOINTS) is listed
    assert endpoint_listed(url, []) is False
