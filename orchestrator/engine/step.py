"""``chorus.step``: one model call under the step's lease; the reply is
stored by :mod:`orchestrator.engine.persist`."""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from orchestrator import registry, tracing
from orchestrator.engine.actions import Action, Revoke, RunStep
from orchestrator.engine.after_commit import settle
from orchestrator.engine.budget import NO_MORE_TOOLS, Budgets
from orchestrator.engine.callpolicies import (
    failure_log,
    model_call,
    rate_limits,
    step_policies,
    stop_error,
)
from orchestrator.engine.cancel import cancel_watch, stop_tree
from orchestrator.engine.checkpoint import take_checkpoint
from orchestrator.engine.context_fit import ContextFit
from orchestrator.engine.cursor import finish_turn
from orchestrator.engine.handoffs import handoff_tool
from orchestrator.engine.history import Prompt, model_prompt
from orchestrator.engine.lease import heartbeat
from orchestrator.engine.persist import (
    load_owned,
    persist,
    record_superseded,
    record_unstored,
)
from orchestrator.engine.planning import plan_tool
from orchestrator.engine.structured_output import (
    final_answer_tool,
)
from orchestrator.engine.subagents import subagent_tool
from orchestrator.engine.tool_outputs import READ_TOOL_OUTPUT, read_output_tool
from orchestrator.errors import ModelError, UnknownAgentError, UnknownToolError
from orchestrator.events import ConversationIds, DeltaBatcher, Outbox, TurnIds
from orchestrator.llm.call import ModelReply, tool_to_openai
from orchestrator.logs import StreamRedaction, bind, redact
from orchestrator.policies import Defer, ModelCall, Policy, Stop
from orchestrator.policies.chain import after_model, before_model, on_model_failure, policies_of
from orchestrator.ratelimit import RateLimited
from orchestrator.runtime import Runtime
from orchestrator.store.db import Db
from orchestrator.store.rows import ConversationRow, TurnRow
from orchestrator.store.step_sql import (
    HANDED_ON,
    Leased,
    deferred_until,
    release_lease,
    take_lease,
)
from orchestrator.store.tables import (
    utcnow,
)
from orchestrator.store.values import storable_text
from orchestrator.tools import toolsets
from orchestrator.tools.names import aliases
from schemas import (
    AgentSpec,
    Event,
    EventName,
    ToolSpec,
    TurnStatus,
)

log = logging.getLogger(__name__)


def _worker() -> str:
    """Which process makes a model call (in ``llm.requested`` events)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class LeaseOwner:
    """Who an execution of a step is, for the conversation's lease.

    Each execution is its own owner (``id``): a redelivered copy of the same
    task (same task id) must not share the lease of the copy still running.
    A step whose database failed cannot give its lease up; its retry is
    sent with :attr:`holder` as ``previous``, whose lease it takes over
    instead of waiting for it to expire (a redelivered copy of that retry
    finds the lease held by the retry's own, new id).

    ``taken`` is None when the take itself failed: its UPDATE may have
    committed with the reply lost, so the lease may be this execution's or
    still the one it would have taken over, and both are handed on.
    """

    id: str
    previous: tuple[str, ...] = ()
    taken: bool | None = False

    @property
    def holder(self) -> str | None:
        """The owners whose lease may still be held once this execution
        failed, comma-separated: its own if it took the lease, else those it
        would have taken over (and its own too if it cannot know whether its
        take committed); at most :data:`HANDED_ON`, the newest first."""
        if self.taken:
            held: tuple[str, ...] = (self.id,)
        elif self.taken is None:
            held = (self.id, *self.previous)
        else:
            held = self.previous
        return ",".join(held[:HANDED_ON]) or None


#: What a handed-on ``previous`` looks like: owners' ids (:func:`new_lease_owner`), comma-separated.
_OWNER_IDS = re.compile(rf"[0-9a-f]{{32}}(?:,[0-9a-f]{{32}}){{0,{HANDED_ON - 1}}}")


def new_lease_owner(previous: object = None) -> LeaseOwner:
    """A new execution's owner (``previous``: see :class:`LeaseOwner`).

    ``previous`` comes from a broker message: anything but up to
    :data:`HANDED_ON` owners' ids (a non-string, a huge string, one the
    database refuses, such as one with a NUL, whose error would fail the
    turn) is ignored."""
    handed = previous if isinstance(previous, str) and _OWNER_IDS.fullmatch(previous) else ""
    return LeaseOwner(uuid.uuid4().hex, tuple(filter(None, handed.split(","))))


def _take_lease(rt: Runtime, ids: tuple[str, str, int], owner: LeaseOwner) -> Leased | None:
    """Take the model-call lease (:func:`~orchestrator.store.step_sql.take_lease`),
    committed on its own. None: this copy leaves."""
    try:
        with rt.autocommit() as connection:
            taken = take_lease(
                connection, ids, (owner.id, owner.previous), rt.settings.lease_seconds
            )
    except Exception:
        owner.taken = None  # it may have committed: the lease may be this execution's
        raise
    owner.taken = taken is not None
    return taken


def _deferred(rt: Runtime, ids: tuple[str, str, int]) -> list[Action]:
    """A copy that found its step deferred past now (its countdown was capped
    below the broker's visibility timeout, or it is a redelivered copy) sends
    the step again for the time left, and leaves."""
    conversation_id, turn_id, step = ids
    with rt.autocommit() as connection:
        found = deferred_until(connection, ids)
    if found is None:
        return []
    due_at, now, priority = found
    left = (due_at - now).total_seconds()
    log.info("step %s of %s: deferred for %.1f s more; sent again", step, turn_id, left)
    return [RunStep(conversation_id, turn_id, step, priority, countdown=left)]


def _fail_owned(rt: Runtime, ids: tuple[str, str, int], owner: str, error: str) -> list[Action]:
    """The turn fails with ``error`` if this copy still owns the step (the
    turn made ``max_steps`` model calls without an answer, or a policy
    stopped the call)."""
    conversation_id, turn_id, step = ids
    with rt.transaction() as (session, outbox):
        loaded = load_owned(session, conversation_id, turn_id, step, owner)
        if loaded is None:
            return []
        conv, turn, _ = loaded
        ended = finish_turn(
            session,
            outbox,
            conv,
            turn,
            TurnStatus.FAILED,
            error=error,
        )
    return ended or []


class _Position(Protocol):
    """What :func:`_defer` reads of a conversation (a row, or the lease's columns)."""

    @property
    def id(self) -> str: ...
    @property
    def turn_id(self) -> str | None: ...
    @property
    def cursor_step(self) -> int: ...
    @property
    def priority(self) -> int: ...


def _defer(
    db: Db,
    conv: _Position,
    countdown: float,
    owner: str | None = None,
    failed: tuple[int, list[dict[str, Any]]] | None = None,
) -> RunStep:
    """Release the lease (only ``owner``'s, when given: outside a lock on
    the row) and record when the step is due again, so the sweeper does not
    take a countdown longer than the stall timeout for a lost task (and
    ``failed``: a failed call's retry count and log); return the step to
    send with that countdown."""
    assert conv.turn_id is not None
    release_lease(db, conv.id, owner, due_in=countdown, failed=failed)
    return RunStep(conv.id, conv.turn_id, conv.cursor_step, conv.priority, countdown=countdown)


def run_step(
    rt: Runtime, conversation_id: str, turn_id: str, step: int, owner: LeaseOwner
) -> list[Action]:
    """Call the model for ``step`` unless another copy holds the lease or
    the cursor has moved on; persist the reply and return what runs next.

    A step that raises gives its lease up first, so its retry (or the
    sweeper) need not wait for the lease to expire; if the provider had
    answered, the call's usage is recorded with it (the retry calls the
    model again). When the database itself is what failed, the lease stays
    held: the retry takes it over (:class:`LeaseOwner`)."""
    answered: list[ModelReply] = []  # the provider's reply, once it came
    try:
        with tracing.step((conversation_id, turn_id, step), answered):
            actions = _run_step(rt, (conversation_id, turn_id, step), owner, answered)
    except BaseException:
        _give_up_lease(rt, (conversation_id, turn_id, step), owner.id, answered)
        raise
    return settle(rt, actions)  # a turn's end: the dequeue or parent's advance if due


def _give_up_lease(
    rt: Runtime, ids: tuple[str, str, int], owner: str, answered: list[ModelReply]
) -> None:
    if answered:
        record_unstored(rt, ids, owner, answered[0])
        return
    try:
        with rt.autocommit() as connection:
            release_lease(connection, ids[0], owner)
    except Exception:  # the database itself may be what failed; the lease then expires
        log.warning("could not release the lease of %s", ids[0], exc_info=True)


class _RedactedDeltas:
    """A :class:`DeltaBatcher` whose text is redacted across pieces: a
    credential split between two deltas is held back until it is whole, and
    masked (each delta redacted alone let a follower join the halves)."""

    def __init__(self, publish: Callable[[str], None]) -> None:
        self._publish = publish
        self._redaction = StreamRedaction()
        self._batcher = DeltaBatcher(self._redacted)

    def _redacted(self, text: str) -> None:
        if shown := self._redaction.feed(text):
            self._publish(shown)

    def add(self, text: str) -> None:
        self._batcher.add(text)

    def flush(self) -> None:
        """Publish the rest: the end of the stream."""
        self._batcher.flush()
        if rest := self._redaction.end():
            self._publish(rest)


def _run_step(
    rt: Runtime, ids: tuple[str, str, int], lease_owner: LeaseOwner, answered: list[ModelReply]
) -> list[Action]:
    """Take the lease, build the request, put it through its policies, call
    the model and store the reply: each part returns the actions that end
    this execution early (a deferral, a stop, a lost lease) instead."""
    began = time.monotonic()
    rt.model.warm()  # before admission: an admitted call is sent at once, not after imports
    (_, turn_id, step), owner = ids, lease_owner.id
    taken = _take_lease(rt, ids, lease_owner)
    if taken is None:
        log.info("step %s of %s: moved on, leased elsewhere or stopping; leaving", step, turn_id)
        return _deferred(rt, ids)
    conv, turn, job = taken
    bind(root_id=conv.root_id, correlation_id=turn.correlation_id)
    spec = AgentSpec.model_validate(conv.agent_spec)
    budgets = Budgets(job)
    request = _request(rt, (ids, owner), spec, budgets.tools_allowed)
    if request is None:
        log.info("step %s of %s: lease lost while listing tools; leaving", step, turn_id)
        return []
    base = model_call(spec, conv, (turn.id, turn.context_data), step, request.sent)
    fit = ContextFit(request.tools, request.prompt)
    admitted = Outbox()
    policies = policies_of(spec)
    chain = (step_policies(policies, budgets, fit), fit, base)
    ready = _policed(rt, admitted, (ids, owner), (conv, turn, job), chain)
    if isinstance(ready, list):  # deferred or stopped by a policy or a rate limit
        return ready
    where = ((ids, owner), (conv, turn))
    called = _call_model(rt, where, request, (policies, ready, fit, base), (admitted, answered))
    if isinstance(called, list):
        return called
    call, reply, lost, started = called
    reply = _qualified(reply, request.names)
    after_model(policies, call, reply)  # the calls under their registered names
    if lost or reply.stopped:
        return _left(rt, ids, reply, lost=lost)
    leased = (conv, turn, job, spec)
    offered = request.names.keys()
    return persist(rt, ids, owner, reply, (started, began), request.tools_allowed, leased, offered)


@dataclass(frozen=True)
class _Request:
    """What a step sends, before its policies: the system prompt (told when
    the tool-call budget is spent), the tools offered (OpenAI format) and
    each one's qualified name → alias, and the prompt."""

    tools_allowed: bool
    system: str
    tools: list[dict[str, Any]]
    names: dict[str, str]
    prompt: Prompt

    @property
    def sent(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The messages and tools, as a :class:`ModelCall` carries them."""
        return self.prompt.messages, self.tools


def _request(
    rt: Runtime, where: tuple[tuple[str, str, int], str], spec: AgentSpec, tools_allowed: bool
) -> _Request | None:
    """The step's request: its tools (none once the tool-call budget is
    spent) and its prompt. None: the lease was lost while MCP servers were
    listed. ``where``: the step and the lease owner."""
    (conversation_id, _, _), owner = where
    system = spec.system if tools_allowed else f"{spec.system}\n\n{NO_MORE_TOOLS}".strip()
    offered = _offered_under_lease(rt, spec, conversation_id, owner) if tools_allowed else None
    if tools_allowed and offered is None:
        return None
    tools, names = offered or ([], {})
    with rt.autocommit() as connection:
        prompt = model_prompt(connection, conversation_id, spec, system, names)
    tools, names = _with_reader(spec, (tools, names), tools_allowed and prompt.cut)
    return _Request(tools_allowed, system, tools, names, prompt)


def _call_model(
    rt: Runtime,
    where: tuple[tuple[tuple[str, str, int], str], tuple[ConversationRow, TurnRow]],
    request: _Request,
    policed: tuple[Sequence[Policy], ModelCall, ContextFit, ModelCall],
    recorded: tuple[Outbox, list[ModelReply]],
) -> tuple[ModelCall, ModelReply, bool, float] | list[Action]:
    """Make the admitted call (``policed``: the agent's policies, the call,
    its context fit and the call before the policies) under the lease's
    heartbeat, streaming its text live, after a checkpoint if it does not
    fit; record ``llm.requested`` (``recorded``: its outbox) beside it,
    and the reply in ``answered`` once the provider answered. Returns the
    call made, the reply, whether the lease was lost meanwhile and when
    the call began; or the actions of a failed call or of a checkpoint
    that ended this execution."""
    ((conversation_id, turn_id, step), owner), (conv, turn) = where
    policies, call, fit, base = policed
    admitted, answered = recorded
    announcement = _Announcement(rt, admitted)
    correlation_id = turn.correlation_id
    root_id = conv.root_id

    def publish_delta(text: str) -> None:
        announcement.wait()  # llm.requested first
        rt.publish_live(
            Event(
                name=EventName.ASSISTANT_DELTA,
                conversation_id=conversation_id,
                root_id=root_id,
                turn_id=turn_id,
                step=step,
                correlation_id=correlation_id,
                time=utcnow(),
                data={"text": storable_text(text)},  # a lone surrogate has no JSON
            )
        )

    deltas = _RedactedDeltas(publish_delta)  # a few live events a second, not one per chunk
    started = time.monotonic()
    try:
        # The heartbeat keeps the lease alive for the whole call (and a
        # checkpoint's call before it), text or not. A lease lost meanwhile
        # lets the call finish: its usage counts.
        with heartbeat(rt).hold(conversation_id, owner) as lease:
            if not fit.fits:
                offered = (request.tools, request.names)
                fitted, ended = _fit_context(
                    rt, (conversation_id, turn_id, step, owner), request.system, offered, base
                )
                if fitted is None:
                    return ended or []
                call = fitted
            reply = rt.model.complete(
                call.model,
                call.messages,
                request.tools or None,
                call.settings,
                on_delta=deltas.add,
                should_stop=cancel_watch(rt, correlation_id),
            )
    except ModelError as exc:
        announcement.wait()
        return _model_failed(rt, (conversation_id, turn_id, step), owner, exc, (policies, call))
    answered.append(reply)
    announcement.wait()
    deltas.flush()  # the rest of the text, before the reply's own events
    rate_limits(rt).after_model(call, reply)
    return call, reply, lease.lost.is_set(), started


def _left(rt: Runtime, ids: tuple[str, str, int], reply: ModelReply, *, lost: bool) -> list[Action]:
    """The call ended but its reply is not this copy's to store: another copy
    took the lease (the usage still counts: the provider was paid) or the
    job was cancelled."""
    conversation_id, turn_id, step = ids
    if lost:
        log.warning("step %d: another copy took the lease; leaving without persisting", step)
        record_superseded(rt, conversation_id, turn_id, step, reply)
    else:
        log.info("step %d: model call stopped: the job was cancelled", step)
    return []


def _admit(
    rt: Runtime,
    outbox: Outbox,
    conv: ConversationIds,
    turn: TurnIds,
    step: int,
    call: ModelCall,
    tokens: int,
) -> float:
    """Ask the agent's rate limits (:class:`~orchestrator.policies.ratelimits.RateLimits`)
    to admit ``call``, a request of ``tokens`` built and about to be sent;
    record ``llm.requested`` when they do (with how long they held the
    call first, if they deferred it). Returns how long to wait first
    (0: admitted)."""
    limits = rate_limits(rt, tokens)
    decided = limits.before_model(call)
    if isinstance(decided, Defer):
        return decided.seconds
    held = {"rate_limited_seconds": round(limits.held, 3)} if limits.held > 0 else {}
    outbox.record(
        EventName.LLM_REQUESTED,
        conv,
        turn,
        step,
        model=call.model,
        admitted_at=limits.admitted_at,
        worker=_worker(),
        **held,
    )
    return 0.0


class _Announcement:
    """``llm.requested`` (if the call was admitted), stored in its own commit
    and published beside the model call, on a thread of its own: the commit
    costs the call no latency. Every follower still sees the call start
    before its text (the first delta waits for it, :meth:`wait`), and the
    event carries the number it is stored with (a number is its
    transaction's, known only once it is stored). Whatever the step does
    next waits for it too, so the request's number precedes the reply's."""

    def __init__(self, rt: Runtime, admitted: Outbox) -> None:
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if admitted.pending:
            self._thread = threading.Thread(
                target=self._store, args=(rt, admitted), name="chorus-announce", daemon=True
            )
            self._thread.start()

    def _store(self, rt: Runtime, admitted: Outbox) -> None:
        try:
            with rt.autocommit() as connection:
                admitted.flush(connection)
            rt.publish(admitted)
        except BaseException as exc:  # raised in the step's thread, by wait()
            self._error = exc

    def wait(self) -> None:
        """Return once the event is stored and published; raise what storing
        it raised."""
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise self._error


def _defer_owned(
    rt: Runtime, conversation_id: str, turn_id: str, step: int, owner: str, wait: float
) -> list[Action]:
    with rt.transaction() as (session, _):
        loaded = load_owned(session, conversation_id, turn_id, step, owner)
        if loaded is None:
            return []
        return [_defer(session, loaded[0], wait)]


def _policed(
    rt: Runtime,
    admitted: Outbox,
    where: tuple[tuple[str, str, int], str],
    leased: tuple[ConversationRow, TurnRow, TurnRow],
    policed: tuple[Sequence[Policy], ContextFit, ModelCall],
) -> ModelCall | list[Action]:
    """Put the call through its policies (:func:`step_policies`: the
    built-in max steps, budget and context fitting around the agent's own),
    then its rate limits (recording ``llm.requested`` in ``admitted``): the
    call to make, or the actions of a deferral or a stop. A call past the
    agent's context-token limit (``fit``) is admitted after its checkpoint
    instead (:func:`_fit_context`). ``where``: the step and lease owner."""
    ids, owner = where
    conv, turn, job = leased
    chain, fit, base = policed
    decider, decided = before_model(chain, base)
    if not isinstance(decided, ModelCall):
        return _policy_decided(rt, ids, owner, (conv, job.id), (decider, decided))
    wait = _admit(rt, admitted, conv, turn, ids[2], decided, fit.size) if fit.fits else 0.0
    if wait > 0:
        with rt.autocommit() as connection:
            return [_defer(connection, conv, wait, owner)]
    return decided


def _policy_decided(
    rt: Runtime,
    ids: tuple[str, str, int],
    owner: str,
    where: tuple[_Position, str],
    decision: tuple[str, Defer | Stop],
) -> list[Action]:
    """A policy deferred the call (the step is sent again with the
    countdown, its due time recorded) or stopped it: the turn fails, or,
    stopped by the job's budget, the job's whole tree (``budget.exceeded``).
    ``where``: the conversation and the job's id."""
    conv, job_id = where
    policy, decided = decision
    if isinstance(decided, Stop) and policy == Budgets.name:
        with rt.autocommit() as connection:
            release_lease(connection, conv.id, owner)
        revoke, actions = stop_tree(rt, job_id, TurnStatus.FAILED, decided.reason, budget=True)
        return [*actions, Revoke(tuple(revoke))]
    if isinstance(decided, Stop):
        return _fail_owned(rt, ids, owner, stop_error(policy, decided))
    log.info("step %s: policy %r defers the model call %.3f s", ids[2], policy, decided.seconds)
    with rt.autocommit() as connection:
        return [_defer(connection, conv, decided.seconds, owner)]


def _fit_context(
    rt: Runtime,
    ids: tuple[str, str, int, str],
    system: str,
    offered: tuple[list[dict[str, Any]], dict[str, str]],
    base: ModelCall,
) -> tuple[ModelCall | None, list[Action] | None]:
    """The prompt passes the agent's context-token limit: take a checkpoint
    first, rebuild the prompt around its summary, put it through the
    agent's policies again (``base``: the call before them) and admit it.

    ``ids``: conversation, turn, step, lease owner; ``offered``: the tools
    and their names (:func:`_offered_tools`). Returns the call to make, or
    None and the actions that end this execution instead (a deferral, a
    retry, a stop, or none when another copy took over).
    """
    conversation_id, turn_id, step, owner = ids
    tools, names = offered
    spec = base.agent
    policies = policies_of(spec)
    try:
        take_checkpoint(rt, conversation_id)  # False: nothing left to summarize; sent as is
        with rt.transaction() as (session, outbox):
            loaded = load_owned(session, conversation_id, turn_id, step, owner)
            if loaded is None:
                return None, []
            conv, turn, _ = loaded
            prompt = model_prompt(session, conversation_id, spec, system, names)
            fit = ContextFit(tools, prompt)  # measures the request; sent as is now
            rebuilt = replace(base, messages=prompt.messages)
            policy, decided = before_model((*policies, fit), rebuilt)
            if isinstance(decided, ModelCall):
                wait = _admit(rt, outbox, conv, turn, step, decided, fit.size)
                if wait > 0:
                    raise RateLimited(wait)
    except ModelError as exc:
        return None, _model_failed(rt, ids[:3], owner, exc, (policies, base))
    except RateLimited as limited:
        return None, _defer_owned(rt, conversation_id, turn_id, step, owner, limited.wait)
    if isinstance(decided, Defer):
        return None, _defer_owned(rt, conversation_id, turn_id, step, owner, decided.seconds)
    if isinstance(decided, Stop):
        return None, _fail_owned(rt, ids[:3], owner, stop_error(policy, decided))
    return decided, None


def _model_failed(
    rt: Runtime,
    ids: tuple[str, str, int],
    owner: str,
    exc: ModelError,
    policed: tuple[Sequence[Policy], ModelCall],
) -> list[Action]:
    """Ask the agent's policies, then the built-in retry, what a failed
    call leads to: a retry after a backoff (the task ends; a new one is sent
    with a countdown, so no worker slot waits), or the turn's failure. The
    failure is counted in the conversation's row (the retry count the next
    attempt's policies see) in the update that defers the step."""
    conversation_id, turn_id, step = ids
    policies, call = policed
    policy, decided = on_model_failure(policies, call, exc)
    delay = decided.seconds if isinstance(decided, Defer) else None
    with rt.transaction() as (session, outbox):
        loaded = load_owned(session, conversation_id, turn_id, step, owner)
        if loaded is None:
            return []
        conv, turn, _ = loaded
        attempt = conv.step_failures + 1
        outbox.record(
            EventName.LLM_FAILED,
            conv,
            turn,
            step=step,
            model=call.model,
            error=redact(str(exc)),
            status=exc.status,
            body=redact(exc.body or ""),
            attempt=attempt,
            retry_in=None if delay is None else round(delay, 3),
            policy=policy,
        )
        if delay is not None:  # the retry is another execution
            failed = (attempt, failure_log(conv, call, exc))
            return [_defer(session, conv, delay, failed=failed)]
        assert isinstance(decided, Stop)
        ended = finish_turn(
            session, outbox, conv, turn, TurnStatus.FAILED, error=stop_error(policy, decided)
        )
    return ended or []


def _offered_specs(spec: AgentSpec) -> list[ToolSpec]:
    """The agent's tools, its MCP servers' tools, one tool per subagent
    template and per handoff target, and the built-in tools it asked for
    (``read_tool_output`` only if it lists it: :func:`_with_reader`)."""
    specs = []
    for name in spec.tools:
        if name == READ_TOOL_OUTPUT:
            continue  # a built-in, below
        try:
            specs.append(registry.get_tool(name).spec)
        except UnknownToolError:
            log.warning("agent %s names tool %s that this worker lacks", spec.name, name)
    for name in spec.toolsets:
        try:
            specs.extend(toolsets.offered(name))
        except UnknownToolError:
            log.warning("agent %s names MCP server %s that this worker lacks", spec.name, name)
    for kind, names, offer in (
        ("subagent", spec.subagents, subagent_tool),
        ("handoff target", spec.handoffs, handoff_tool),
    ):
        for name in names:
            try:
                specs.append(offer(name))
            except UnknownAgentError:
                log.warning("agent %s names %s %s that this worker lacks", spec.name, kind, name)
    for builtin in (plan_tool(spec), final_answer_tool(spec), read_output_tool(spec, cut=False)):
        if builtin is not None:
            specs.append(builtin)
    return specs


def _offered_tools(spec: AgentSpec) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The tools as the model sees them, under provider-legal aliases, and
    each one's qualified name → alias (:func:`orchestrator.toolnames.aliases`)."""
    specs = _offered_specs(spec)
    names = aliases(s.name for s in specs)
    return [tool_to_openai(s, names[s.name]) for s in specs], names


def _with_reader(
    spec: AgentSpec, offered: tuple[list[dict[str, Any]], dict[str, str]], cut: bool
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """``offered``, with ``read_tool_output`` if the prompt holds a ``cut``
    output. Its name is provider-legal, and no other tool of the agent may
    take it (:func:`orchestrator.toolnames.check_unique`): it is its own alias."""
    tools, names = offered
    reader = read_output_tool(spec) if cut else None
    if reader is None or READ_TOOL_OUTPUT in names:
        return offered
    return [*tools, tool_to_openai(reader, READ_TOOL_OUTPUT)], {
        **names,
        READ_TOOL_OUTPUT: READ_TOOL_OUTPUT,
    }


def _offered_under_lease(
    rt: Runtime, spec: AgentSpec, conversation_id: str, owner: str
) -> tuple[list[dict[str, Any]], dict[str, str]] | None:
    """:func:`_offered_tools`, holding the lease while MCP servers are listed
    (that may take a while); None if the lease was lost meanwhile."""
    if not spec.toolsets:
        return _offered_tools(spec)
    with heartbeat(rt).hold(conversation_id, owner) as listing:
        offered = _offered_tools(spec)
    return None if listing.lost.is_set() else offered


def _qualified(reply: ModelReply, names: dict[str, str]) -> ModelReply:
    """The reply with each call to an offered alias naming its qualified
    tool: what is stored, checked and run. Other names are kept as sent."""
    qualified = {a: q for q, a in names.items() if a != q}
    if not any(c.tool in qualified for c in reply.tool_calls):
        return reply
    calls = [
        c.model_copy(update={"tool": qualified[c.tool]}) if c.tool in qualified else c
        for c in reply.tool_calls
    ]
    return replace(reply, tool_calls=calls)
