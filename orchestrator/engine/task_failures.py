"""Unexpected exceptions in a task: retry what is transient, fail the turn otherwise.

A step, tool or advance that raises something other than a model error
would otherwise ack its task and leave the turn running, and the sweeper
would send the same failing work again forever. A lost database or Redis
connection deserves a few retries; anything else (a bad stored spec, an
unknown transformer, a bug) fails the turn with the error, once.
"""

from __future__ import annotations

import logging

import kombu.exceptions
import redis
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from orchestrator.engine.actions import Action
from orchestrator.engine.cursor import finish_turn, is_current
from orchestrator.logs import redact
from orchestrator.runtime import Runtime
from orchestrator.store.tables import Conversation, ToolCallRow, Turn
from schemas import TurnStatus

log = logging.getLogger(__name__)

_TRANSIENT = (
    OperationalError,  # connection lost, server restarting, deadlock, lock timeout
    InterfaceError,
    PoolTimeoutError,  # no pooled connection free within the pool's timeout: a busy process
    redis.ConnectionError,
    redis.TimeoutError,
    kombu.exceptions.OperationalError,  # the broker is unreachable while sending
    ConnectionError,
    TimeoutError,
)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a lost connection worth retrying."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, _TRANSIENT):
            return True
        if isinstance(current, DBAPIError) and current.connection_invalidated:
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def describe(exc: BaseException) -> str:
    """The error a failed turn reports: the exception's type and message."""
    return redact(f"{type(exc).__name__}: {exc}")


def _names(*ids: object) -> bool:
    """Are these a task's ids as the engine sends them (strings)? A broker
    message may carry anything: ``session.get`` would look a dict or a
    tuple up as an identity (``{"id": <a live call>}``) where the task's
    own statements refused it, and fail a turn the message does not name."""
    return all(isinstance(found, str) for found in ids)


def fail_at(
    rt: Runtime, conversation_id: str, turn_id: str, step: int, segment: int, error: str
) -> list[Action]:
    """Fail the turn if its cursor is still at (``step``, ``segment``); a
    subagent's failure answers its parent's call with the error."""
    if not _names(conversation_id, turn_id):
        return []
    with rt.transaction() as (session, outbox):
        conv = session.get(Conversation, conversation_id)
        if conv is None or not is_current(conv, turn_id, step, segment):
            return []
        turn = session.get(Turn, turn_id)
        assert turn is not None
        log.error("turn %s fails at step %d: %s", turn_id, step, error)
        return finish_turn(session, outbox, conv, turn, TurnStatus.FAILED, error=error) or []


def fail_call(rt: Runtime, call_id: str, error: str) -> list[Action]:
    """Fail the turn of tool call ``call_id`` if its segment is still current."""
    if not _names(call_id):
        return []
    with rt.session() as session:
        call = session.get(ToolCallRow, call_id)
        if call is None:
            return []
        where = (call.conversation_id, call.turn_id, call.step, call.segment)
    conversation_id, turn_id, step, segment = where
    return fail_at(
        rt, conversation_id, turn_id, step, segment, f"tool call {call_id} failed: {error}"
    )
