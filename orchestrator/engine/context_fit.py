"""Context fitting as a built-in policy: does a step's request fit the
agent's ``context_tokens``?"""

from __future__ import annotations

from typing import Any

from orchestrator.engine.history import Prompt
from orchestrator.policies import ModelCall, Policy
from orchestrator.ratelimit import request_tokens


class ContextFit(Policy):
    """Measures the request the agent's policies produced (it runs after
    them, before the rate limits). Past the agent's ``context_tokens`` the
    step takes a checkpoint first, rebuilds the prompt around its summary,
    puts it through the agent's policies again and only then admits it
    (:func:`orchestrator.engine.step._fit_context`); the call itself is let
    through unchanged. One instance a request: it carries the request's
    size (what the rate limits admit) and whether it fits.
    """

    name = "context-fit"

    def __init__(self, tools: list[dict[str, Any]], prompt: Prompt) -> None:
        self.tools = tools
        self.prompt = prompt
        #: The request's tokens, once measured.
        self.size = 0
        #: Whether it fits the agent's context-token limit.
        self.fits = True

    def before_model(self, call: ModelCall) -> ModelCall:
        # the size of the prompt's own messages is known (cached) unless a policy rewrote them
        known = self.prompt.chars if call.messages is self.prompt.messages else None
        self.size = request_tokens(call.messages, self.tools, known)
        limit = call.agent.context_tokens
        self.fits = limit is None or self.size <= limit
        return call
