"""Which tenant owns what. The tenant of an HTTP token is stored on the
root conversation of every job it submits or fork it makes
(``chorus_conversation.tenant``), in the transaction that creates it;
a conversation, its subagents' included, and a job belong to their root's
tenant. A token sees its own tenant's; an ``admin`` token sees every
tenant's. Anything else answers 404, as if it did not exist."""

from __future__ import annotations

from sqlmodel import Session

from orchestrator.client import Client, Job
from orchestrator.engine.turns import JobRef
from orchestrator.errors import ApprovalNotFound, ConversationNotFound, JobNotFound
from orchestrator.store.approval_sql import call_state
from orchestrator.store.tables import Conversation, Turn
from orchestrator.store.token_sql import Principal, Scope
from orchestrator.store.values import check


def _sees(principal: Principal, session: Session, root_id: str) -> bool:
    if principal.scope is Scope.ADMIN:
        return True
    root = session.get(Conversation, root_id)
    return root is not None and root.tenant == principal.tenant


def job(client: Client, principal: Principal, job_id: str) -> Job:
    """The job, if this principal may see it; else :class:`JobNotFound`."""
    check(job_id, "job_id")
    with client.runtime.session() as session:
        turn = session.get(Turn, job_id)
        if turn is None or not _sees(principal, session, turn.root_id):
            raise JobNotFound(job_id)
        return Job(client, JobRef(turn.id, turn.conversation_id, turn.root_id))


def conversation(client: Client, principal: Principal, conversation_id: str) -> str:
    """The conversation's root id, if this principal may see the
    conversation; else :class:`ConversationNotFound`."""
    check(conversation_id, "conversation_id")
    with client.runtime.session() as session:
        conv = session.get(Conversation, conversation_id)
        if conv is None or not _sees(principal, session, conv.root_id):
            raise ConversationNotFound(conversation_id)
        return conv.root_id


def call(client: Client, principal: Principal, call_id: str) -> None:
    """Nothing, if this principal may see the tool call's job; else
    :class:`ApprovalNotFound`."""
    check(call_id, "call_id")
    with client.runtime.session() as session:
        state = call_state(session, call_id)
        if state is None or not _sees(principal, session, state.root_id):
            raise ApprovalNotFound(call_id)
