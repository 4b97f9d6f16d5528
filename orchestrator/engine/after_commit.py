"""Actions a task needs only if something is still so after its commit.

A subagent's end asks for its parent's ``chorus.advance`` only if no call
of the parent's segment is still out (``RunAdvance.if_ready``); a turn's
end asks for a ``chorus.dequeue`` only if its conversation's inbox holds
a message (``Dequeue.if_waiting``). :func:`settle` reads both after
the transaction that recorded the end has committed, so it sees every
write committed before it:

- of a segment's answers, the last one always finds no call out and
  advances (two that both do send two advances: the cursor's
  compare-and-set lets one move it). A 1,000-child fan-out sends one
  advance, or a few, not 1,000;
- a message queued before the read is in the inbox's stream; one queued
  after it is started by the dequeue its own ``send`` asks for, which
  finds the conversation idle.

If a read fails the action is kept: an extra advance or dequeue is a cheap
no-op, a missing one would wait for the sweeper. Ends reached outside
``chorus.step`` (a failure, the sweeper, a stop) are not read here: their
advance or dequeue is sent as before.
"""

from __future__ import annotations

import logging

from orchestrator.engine.actions import Action, Dequeue, RunAdvance
from orchestrator.keys import inbox
from orchestrator.runtime import Runtime
from orchestrator.store.tool_call_sql import call_out

log = logging.getLogger(__name__)


def settle(rt: Runtime, actions: list[Action]) -> list[Action]:
    """``actions`` without the conditional ones that are not needed now."""
    advances = [a for a in actions if isinstance(a, RunAdvance) and a.if_ready]
    dequeues = [a for a in actions if isinstance(a, Dequeue) and a.if_waiting]
    if not advances and not dequeues:
        return actions
    try:
        not_needed = {id(a) for a in _not_needed(rt, advances, dequeues)}
    except Exception:
        log.warning("could not read what a turn's end still needs; sending it", exc_info=True)
        return actions
    return [a for a in actions if id(a) not in not_needed]


def _not_needed(rt: Runtime, advances: list[RunAdvance], dequeues: list[Dequeue]) -> list[Action]:
    found: list[Action] = []
    if advances:
        with rt.autocommit() as connection:
            found += [a for a in advances if call_out(connection, a.turn_id, a.step, a.segment)]
    if dequeues:
        prefix = rt.settings.redis_prefix
        found += [d for d in dequeues if not rt.redis.xlen(inbox(prefix, d.conversation_id))]
    return found
