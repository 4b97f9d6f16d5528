"""The running server, driven from its own OpenAPI document (schemathesis):
every generated request answers without a 5xx, with a documented status,
content type and body."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server.conftest import Server, bearer

pytestmark = pytest.mark.integration

#: Generated requests per operation: enough to reach every parameter's
#: edges (ids with NUL, huge numbers, odd times) in well under 30 s.
EXAMPLES = 12
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
#: Every route, as the document must name it.
ROUTES = {
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{job_id}"),
    ("GET", "/v1/jobs/{job_id}/usage"),
    ("GET", "/v1/jobs/{job_id}/result"),
    ("GET", "/v1/jobs/{job_id}/output"),
    ("POST", "/v1/jobs/{job_id}/cancel"),
    ("GET", "/v1/jobs/{job_id}/events"),
    ("POST", "/v1/conversations/{conversation_id}/messages"),
    ("GET", "/v1/conversations/{conversation_id}/messages"),
    ("GET", "/v1/conversations/{conversation_id}/queue/{entry_id}"),
    ("DELETE", "/v1/conversations/{conversation_id}/queue"),
    ("POST", "/v1/conversations/{conversation_id}/fork"),
    ("GET", "/v1/conversations/{conversation_id}/usage"),
    ("GET", "/v1/conversations/{conversation_id}/events"),
    ("GET", "/v1/approvals"),
    ("GET", "/v1/me"),
    ("GET", "/v1/runs"),
    ("GET", "/v1/runs/{job_id}"),
    ("GET", "/v1/runs/{job_id}/events"),
    ("POST", "/v1/approvals/{call_id}"),
    ("GET", "/v1/health"),
    ("GET", "/v1/ready"),
}


def test_the_document_describes_every_route_its_errors_and_streams(server: Server) -> None:
    document = httpx.get(f"{server.url}/openapi.json").json()
    operations = {
        (method.upper(), path): op
        for path, methods in document["paths"].items()
        for method, op in methods.items()
    }
    assert set(operations) == ROUTES
    assert set(document["components"]["schemas"]["ErrorBody"]["properties"]) == {
        "type",
        "message",
        "fields",
    }
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for key, op in operations.items():
        if key[1] not in ("/v1/health", "/v1/ready"):
            assert {"401", "404", "422"} <= set(op["responses"]), key
    for path in ("/v1/jobs/{job_id}/events", "/v1/conversations/{conversation_id}/events"):
        assert "text/event-stream" in document["paths"][path]["get"]["responses"]["200"]["content"]


def test_generated_requests_get_documented_answers(server: Server, acme: str) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(ROUTES)
    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def answers_as_documented(case: schemathesis.Case) -> None:
            case.call_and_validate(
                base_url=server.url, headers=bearer(acme), checks=CHECKS, timeout=30
            )

        answers_as_documented()
