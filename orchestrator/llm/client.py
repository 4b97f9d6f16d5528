"""The model client the runtime carries: one interface, several implementations.

The engine calls a model only through :class:`ModelClient` (held by
:attr:`orchestrator.runtime.Runtime.model`). :class:`LiteLLMClient` is the
real one (litellm, with the openai SDK fast path: :mod:`orchestrator.llm.call`);
:mod:`orchestrator.llm.function` holds in-process ones for tests
(:class:`~orchestrator.llm.function.FunctionModel`,
:class:`~orchestrator.llm.function.ScriptedModel`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from orchestrator.llm import call
from orchestrator.llm.reply import ModelReply


@runtime_checkable
class ModelClient(Protocol):
    """Calls a model once, streaming. Every implementation:

    - passes each piece of assistant text to ``on_delta`` as it streams (an
      exception of ``on_delta`` propagates unchanged);
    - polls ``should_stop`` before each piece and, when it says so, returns
      the text so far with ``stopped=True`` and no tool calls;
    - reports usage in the reply;
    - raises :class:`~orchestrator.errors.ModelError` (``status``, ``body``,
      ``retryable``) for any failure of the model.
    """

    def warm(self) -> None:
        """Load what the first call would (before a rate limit admits it)."""

    def complete(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        model_settings: dict[str, Any],
        on_delta: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> ModelReply:
        """One call: OpenAI-format ``messages`` and ``tools``, the agent's
        ``model`` and ``model_settings``; the collected reply."""


class LiteLLMClient:
    """The real client: litellm for every provider, the openai SDK for
    OpenAI-protocol ones (:func:`orchestrator.llm.call.complete` and
    :func:`orchestrator.llm.call.warm` themselves: no frame added to the
    hot path)."""

    warm = staticmethod(call.warm)
    complete = staticmethod(call.complete)
