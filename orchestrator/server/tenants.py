"""Which tenant owns what. The tenant of an HTTP token is stamped on the
root conversation of every job it submits (``chorus_conversation.tenant``);
a conversation, its subagents' included, and a job belong to their root's
tenant. A token sees its own tenant's; an ``admin`` token sees every
tenant's. Anything else answers 404, as if it did not exist."""

from __future__ import annotations

from sqlalchemy import update
from sqlmodel import Session, col

from orchestrator.client import Client, Job
from orchestrator.engine.turns import JobRef
from orchestrator.errors import ConversationNotFound, JobNotFound
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


def stamp(client: Client, root_id: str, tenant: str) -> None:
    """Give a new root conversation its tenant (one it has is kept)."""
    with client.runtime.session() as session:
        session.execute(
            update(Conversation)
            .where(col(Conversation.id) == root_id, col(Conversation.tenant).is_(None))
            .values(tenant=tenant)
        )
        session.commit()
