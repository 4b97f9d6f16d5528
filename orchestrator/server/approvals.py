"""``/v1/approvals``: the tool calls waiting for a person's answer, and the answer.

Tenant-scoped like jobs: a token lists and answers only the calls of its
tenant's jobs (an ``admin`` token every tenant's); another tenant's call
answers 404 as an unknown one does. The answer is recorded with ``by`` the
token's name (``token:<id>`` for a token created without one), once: a
second answer is a 409 ``ConflictError`` and the first stands.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from orchestrator.errors import InvalidRequestError
from orchestrator.server import tenants
from orchestrator.server.auth import Reader, Submitter, client_of
from orchestrator.server.errors import COMMON, responses
from orchestrator.server.models import ApprovalAnswered, ApprovalRequest
from orchestrator.server.params import CallId
from orchestrator.store.token_sql import Principal, Scope
from schemas import PendingApproval

router = APIRouter(prefix="/v1/approvals", tags=["approvals"], responses=responses(*COMMON))

Filter = Annotated[str | None, Query(min_length=1, max_length=64)]


@router.get("", response_model=list[PendingApproval])
def pending(
    principal: Reader,
    request: Request,
    conversation_id: Annotated[
        str | None,
        Query(
            min_length=1, max_length=64, description="A conversation, or the tree it is root of."
        ),
    ] = None,
    agent: Filter = None,
    tool: Filter = None,
    tenant: Annotated[
        str | None, Query(min_length=1, max_length=64, description="Admin tokens: one tenant's.")
    ] = None,
) -> list[PendingApproval]:
    """The tool calls waiting for an answer, oldest first (at most 1,000).
    Only an admin token sees other tenants' calls."""
    if principal.scope is not Scope.ADMIN:
        if tenant is not None and tenant != principal.tenant:
            return []
        tenant = principal.tenant
    return client_of(request).pending_approvals(
        conversation_id=conversation_id, agent=agent, tool=tool, tenant=tenant
    )


@router.post("/{call_id}", response_model=ApprovalAnswered)
def answer(
    call_id: CallId, body: ApprovalRequest, principal: Submitter, request: Request
) -> ApprovalAnswered:
    """Approve (the call runs, the turn goes on) or deny (the model gets an
    error result with the reason) a waiting tool call; answered once (409
    ``ConflictError`` for a second answer)."""
    client = client_of(request)
    tenants.call(client, principal, call_id)
    by = _answerer(principal)
    if body.decision == "approve":
        if body.reason is not None:
            raise InvalidRequestError("reason: an approval takes a note", ["reason"])
        client.approve(call_id, note=body.note, by=by)
        return ApprovalAnswered(call_id=call_id, decision="approved", by=by)
    if body.note is not None:
        raise InvalidRequestError("note: a denial takes a reason", ["note"])
    if body.reason is None:
        raise InvalidRequestError("reason: a denial needs a reason", ["reason"])
    client.deny(call_id, reason=body.reason, by=by)
    return ApprovalAnswered(call_id=call_id, decision="denied", by=by)


def _answerer(principal: Principal) -> str:
    return principal.name or f"token:{principal.token_id}"
