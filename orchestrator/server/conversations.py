"""``/v1/conversations``: send, queue, history, fork, usage, events."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from orchestrator.server import follow, sse, tenants
from orchestrator.server.auth import Reader, Submitter, client_of
from orchestrator.server.errors import COMMON, responses
from orchestrator.server.models import Forked, MessageSent, QueueCleared, SendRequest
from orchestrator.server.params import (
    ConversationId,
    Deltas,
    EntryId,
    ResumeAfter,
)
from schemas import Message, Usage

router = APIRouter(prefix="/v1/conversations", tags=["conversations"], responses=responses(*COMMON))


@router.post("/{conversation_id}/messages", status_code=202, response_model=MessageSent)
def send(
    conversation_id: ConversationId, body: SendRequest, principal: Submitter, request: Request
) -> MessageSent:
    """Send a message: an idle conversation starts a turn at once, a busy
    one queues it until its turn ends. ``context_data.tenant`` is the
    token's tenant."""
    client = client_of(request)
    tenants.conversation(client, principal, conversation_id)
    data = None if body.context_data is None else {**body.context_data}
    if data is not None:
        data["tenant"] = principal.tenant
    entry = client.send(
        conversation_id, body.text, context_data=data, budget=body.budget, priority=body.priority
    )
    job = client.job_for_message(conversation_id, entry)
    return MessageSent(entry_id=entry, job_id=job.id if job else None)


@router.get("/{conversation_id}/queue/{entry_id}", response_model=MessageSent)
def sent_message(
    conversation_id: ConversationId, entry_id: EntryId, principal: Reader, request: Request
) -> MessageSent:
    """The job a sent message started (``job_id`` None while it waits in
    the queue, or until the turn it starts is stored)."""
    client = client_of(request)
    tenants.conversation(client, principal, conversation_id)
    job = client.job_for_message(conversation_id, entry_id)
    return MessageSent(entry_id=entry_id, job_id=job.id if job else None)


@router.get("/{conversation_id}/messages", response_model=list[Message])
def history(conversation_id: ConversationId, principal: Reader, request: Request) -> list[Message]:
    """Every stored message of the conversation, oldest first."""
    client = client_of(request)
    tenants.conversation(client, principal, conversation_id)
    return client.history(conversation_id)


@router.delete("/{conversation_id}/queue", response_model=QueueCleared)
def clear_queue(
    conversation_id: ConversationId, principal: Submitter, request: Request
) -> QueueCleared:
    """Drop the conversation's queued messages."""
    client = client_of(request)
    tenants.conversation(client, principal, conversation_id)
    return QueueCleared(cleared=client.clear_queue(conversation_id))


@router.post("/{conversation_id}/fork", status_code=201, response_model=Forked)
def fork(conversation_id: ConversationId, principal: Submitter, request: Request) -> Forked:
    """A new conversation (of the token's tenant) with a copy of this one's messages."""
    client = client_of(request)
    tenants.conversation(client, principal, conversation_id)
    copy = client.fork(conversation_id, tenant=principal.tenant)
    return Forked(conversation_id=copy)


@router.get("/{conversation_id}/usage", response_model=Usage)
def usage(conversation_id: ConversationId, principal: Reader, request: Request) -> Usage:
    """Tokens and cost of every model call of the conversation."""
    client = client_of(request)
    tenants.conversation(client, principal, conversation_id)
    return client.usage(conversation_id)


@router.get("/{conversation_id}/events", **sse.ROUTE)
def events(
    conversation_id: ConversationId,
    principal: Reader,
    request: Request,
    since: ResumeAfter,
    deltas: Deltas = False,
) -> StreamingResponse:
    """Every event of the conversation's tree (its root's) as Server-Sent
    Events: stored ones, then each turn that runs, live, until the root
    conversation is idle."""
    root = tenants.conversation(client_of(request), principal, conversation_id)
    return sse.stream(
        request, principal, follow.tree_events(client_of(request), root, since, deltas)
    )
