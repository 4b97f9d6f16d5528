"""The policy seam: what a policy sees of a model call and what it may decide.

A policy is worker-side code the operator registers by name (like a tool);
an agent lists the policies its model calls go through. Each hook gets a
:class:`ModelCall`: the request about to be sent (model, messages in the
OpenAI chat format, tools, settings) and what the engine knows durably of
the step (its attempt number and the earlier failures at this step, read
from the conversation's row). A policy keeps no state in process memory:
the next attempt may run in another process, on another machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.errors import ModelError
from orchestrator.llm.reply import ModelReply
from schemas import AgentSpec


@dataclass(frozen=True)
class Failure:
    """One failed model call of the current step, as stored with the conversation."""

    model: str
    status: int | None
    retryable: bool
    error: str = ""

    @property
    def server_error(self) -> bool:
        """A 5xx answer from the provider."""
        return self.status is not None and self.status >= 500

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "status": self.status,
            "retryable": self.retryable,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Failure:
        return cls(
            model=str(data.get("model", "")),
            status=data.get("status"),
            retryable=bool(data.get("retryable", False)),
            error=str(data.get("error", "")),
        )


@dataclass(frozen=True)
class ModelCall:
    """A model call about to be made (or just made), as policies see it.

    Attributes:
        agent: the agent's spec (its ``model`` is the one it names; ``model``
            below is the one this call uses).
        conversation_id, turn_id, step: where the call is.
        context_data: the job's ``context_data`` (e.g. a tenant to key limits by).
        attempt: 1 for the step's first call, n+1 after n failed ones.
        failures: the step's failed calls so far, oldest first.
        model: the litellm model string to call.
        messages: the messages to send, in the OpenAI chat format. Never
            change them in place (a worker keeps them for later steps):
            :meth:`rewrite` with new lists and dicts.
        tools: the tool schemas offered (OpenAI format).
        settings: extra litellm arguments (the agent's ``model_settings``).
        checkpoint: the call summarizes the conversation for a checkpoint
            (its messages are the summarizer's prompt), not a step's.
    """

    agent: AgentSpec
    conversation_id: str
    turn_id: str
    step: int
    context_data: Mapping[str, Any]
    attempt: int
    failures: tuple[Failure, ...]
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    checkpoint: bool = False

    @property
    def last_failure(self) -> Failure | None:
        """The step's latest failed call, if any."""
        return self.failures[-1] if self.failures else None

    def rewrite(
        self,
        *,
        model: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> ModelCall:
        """This call with another model, messages or settings."""
        changes: dict[str, Any] = {}
        if model is not None:
            changes["model"] = model
        if messages is not None:
            changes["messages"] = messages
        if settings is not None:
            changes["settings"] = settings
        return replace(self, **changes)


@dataclass(frozen=True)
class ToolCall:
    """A tool call about to run (or just run), as policies see it.

    Attributes:
        agent: the spec of the agent whose model made the call.
        conversation_id, turn_id, step: where the call is.
        context_data: the job's ``context_data``.
        tool: the tool's registered (qualified) name.
        params: the arguments the tool gets (:meth:`rewrite` to change
            them; the stored call keeps what the model sent).
        call_id: the call's id, the same for every run of it (the tool's
            idempotency key).
        attempt: which run of the call this is (a run whose process died is
            run again).
    """

    agent: AgentSpec
    conversation_id: str
    turn_id: str
    step: int
    context_data: Mapping[str, Any]
    tool: str
    params: dict[str, Any]
    call_id: str
    attempt: int

    def rewrite(self, *, params: dict[str, Any]) -> ToolCall:
        """This call with other arguments."""
        return replace(self, params=params)


@dataclass(frozen=True)
class Defer:
    """Send the call later: the step ends and is sent again ``seconds`` from
    now (a countdown in the broker, the due time recorded: no worker slot
    waits). From :meth:`Policy.on_model_failure`: a retry after a backoff.
    From :meth:`Policy.before_tool`: the tool task ends without running the
    tool, and the call is sent again ``seconds`` from now (its run not
    counted; the step waits for it as for any running call)."""

    seconds: float
    reason: str = ""


@dataclass(frozen=True)
class Stop:
    """Do not call the model: the turn fails with ``reason``. From
    :meth:`Policy.before_tool`: the tool (or subagent) does not run and
    the model gets an error result with ``reason``."""

    reason: str


class Policy:
    """A policy around each model call; every hook does nothing by default.

    Hooks, and the order they run in (an agent's ``policies=[a, b]``):

    * :meth:`before_model`, a then b: return the call (admitted, as is or
      rewritten: the next policy sees the rewrite), :class:`Defer` or
      :class:`Stop` (the first of those ends the chain).
    * :meth:`after_model`, b then a: observe the reply.
    * :meth:`on_model_failure`, b then a: return :class:`Defer` (retry
      later), :class:`Stop` (fail the turn) or None (let the next one
      decide). If none decides, the built-in retry does (:class:`Retry`).

    * :meth:`before_tool`, a then b, in the tools worker (for a subagent
      call, before its child starts): return the call (as is or with
      rewritten params), :class:`Defer` (run it later) or :class:`Stop`
      (the tool does not run; the model gets an error result).
    * :meth:`after_tool`, b then a: observe the result (of a tool run,
      or a subagent's answer, in ``chorus.advance`` before the parent
      moves on; not a call refused before it ran).

    A hook that raises fails the turn with a
    :class:`~orchestrator.errors.PolicyError` naming the policy.
    """

    #: The name it is registered under (set by :func:`register_policy`).
    name: str = ""

    def before_model(self, call: ModelCall) -> ModelCall | Defer | Stop:
        return call

    def after_model(self, call: ModelCall, reply: ModelReply) -> None:
        return None

    def on_model_failure(self, call: ModelCall, error: ModelError) -> Defer | Stop | None:
        return None

    def before_tool(self, call: ToolCall) -> ToolCall | Defer | Stop:
        return call

    def after_tool(self, call: ToolCall, result: Any, is_error: bool) -> None:
        return None
