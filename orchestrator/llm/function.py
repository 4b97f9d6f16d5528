"""In-process models for tests: a Python function, or a script, as the model.

Both implement :class:`~orchestrator.llm.client.ModelClient` without litellm
or any network: the reply streams to ``on_delta`` in word pieces (so live
``assistant.delta`` events flow as with a provider), tool-call arguments
are parsed as a provider's are, usage is a word count unless the reply
sets it, and a failure is a :class:`~orchestrator.errors.ModelError`.

Example::

    def model(request: ModelRequest) -> Reply | str:
        if not request.tool_results:
            return Reply.call(call("add", a=1, b=2))
        return f"the sum is {request.tool_results[-1]}"

    Harness(modules=["myagents"], model=FunctionModel(model))
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from orchestrator.errors import ModelError
from orchestrator.llm.reply import ModelReply, parse_arguments
from orchestrator.llm.script import (
    Reply,
    ScriptFailure,
    ScriptItem,
    play,
    prompt_tokens,
    text_pieces,
    words,
)
from orchestrator.store.values import storable_text
from schemas.content import ToolCallBlock, Usage


@dataclass(frozen=True)
class ModelRequest:
    """What a model is asked: as a provider would receive it.

    Attributes:
        model: The agent's model string (route on it to play several agents).
        messages: OpenAI-format chat messages, the system prompt first.
        tools: OpenAI-format tool definitions offered (empty for none).
        model_settings: The agent's ``model_settings``.
    """

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    model_settings: dict[str, Any]

    @property
    def tool_names(self) -> list[str]:
        """The names of the offered tools, as the model sees them."""
        return [t["function"]["name"] for t in self.tools]

    @property
    def system(self) -> str:
        """The system prompt ("" without one)."""
        first = self.messages[0] if self.messages else {}
        return str(first.get("content") or "") if first.get("role") == "system" else ""

    @property
    def user_text(self) -> str:
        """The text of the last user message ("" if there is none)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return str(message.get("content") or "")
        return ""

    @property
    def tool_results(self) -> list[str]:
        """The results of the tool calls answered since the last assistant
        message, in order, as the model sees them (strings)."""
        results: list[str] = []
        for message in reversed(self.messages):
            if message.get("role") != "tool":
                break
            results.insert(0, str(message.get("content")))
        return results

    @property
    def steps(self) -> int:
        """How many assistant messages the conversation holds already."""
        return sum(1 for m in self.messages if m.get("role") == "assistant")


#: What a model function returns: a :class:`Reply`, or just the text of one.
ModelFunction: TypeAlias = Callable[[ModelRequest], "Reply | str"]


class FunctionModel:
    """A model that is a Python function of the request.

    The function receives a :class:`ModelRequest` and returns a
    :class:`~orchestrator.llm.script.Reply` (text and/or tool calls, built
    with ``Reply.say`` / ``Reply.call`` and ``call``) or a string. It may
    raise :class:`~orchestrator.errors.ModelError` to play a provider
    failure (``ModelError("overloaded", status=529, retryable=True)``);
    any other exception becomes a non-retryable ``ModelError`` naming it,
    as a provider's 400 would.

    Every call is kept in :attr:`requests`, in order.
    """

    def __init__(self, function: ModelFunction) -> None:
        self.function = function
        self.requests: list[ModelRequest] = []

    def warm(self) -> None:
        """Nothing to load."""

    def complete(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        model_settings: dict[str, Any],
        on_delta: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> ModelReply:
        request = ModelRequest(model, messages, list(tools or []), dict(model_settings))
        self.requests.append(request)
        try:
            answer = self.function(request)
        except ModelError:
            raise
        except Exception as exc:
            raise ModelError(
                f"the model function raised {exc!r}", status=400, retryable=False
            ) from exc
        if isinstance(answer, str):
            answer = Reply.say(answer)
        if not isinstance(answer, Reply):
            raise ModelError(
                f"the model function returned {answer!r}, not a Reply or a str",
                status=400,
                retryable=False,
            )
        return _stream(answer, messages, on_delta, should_stop)


class ScriptedModel(FunctionModel):
    """A model that plays a script: the item for the conversation's next
    step (its count of assistant messages), a fixed
    :class:`~orchestrator.llm.script.Reply` or a function of the messages.

    ``scripts`` maps a model string to its script, for several agents;
    a single sequence answers every model.
    """

    def __init__(self, script: Sequence[ScriptItem] | dict[str, Sequence[ScriptItem]]) -> None:
        scripts = script if isinstance(script, dict) else None
        fixed = None if isinstance(script, dict) else tuple(script)

        def answer(request: ModelRequest) -> Reply:
            items = fixed if scripts is None else scripts.get(request.model)
            if items is None:
                raise ModelError(
                    f"no script for model {request.model!r}; scripted: {sorted(scripts or {})}",
                    status=400,
                    retryable=False,
                )
            try:
                return play(request.model, items, request.messages, passthrough=(ModelError,))
            except ScriptFailure as exc:
                raise ModelError(str(exc), status=400, retryable=False) from exc

        super().__init__(answer)


def _stream(
    reply: Reply,
    messages: list[dict[str, Any]],
    on_delta: Callable[[str], None] | None,
    should_stop: Callable[[], bool] | None,
) -> ModelReply:
    """The reply as a provider would stream it: text in word pieces, the stop
    polled before each; then the calls, parsed as a stream's are."""
    sent: list[str] = []
    first: float | None = None  # when the first piece (or the calls) came
    for piece in [*text_pieces(reply.text), None]:  # None: the calls, after the text
        if should_stop is not None and should_stop():
            text = storable_text("".join(sent))
            return ModelReply(text, [], Usage(), stopped=True, first_token_at=first)
        if piece is None:
            break
        first = time.monotonic() if first is None else first
        sent.append(piece)
        if on_delta is not None:
            on_delta(piece)
    if first is None and reply.tool_calls:
        first = time.monotonic()
    calls = [
        ToolCallBlock(
            tool_request_id=storable_text(c.id or f"call_{uuid.uuid4().hex}"),
            tool=storable_text(c.tool),
            params=parse_arguments(c.arguments()),
        )
        for c in reply.tool_calls
    ]
    produced = words(reply.text) + sum(1 + words(c.arguments()) for c in reply.tool_calls)
    usage = Usage(
        input_tokens=prompt_tokens(messages) if reply.input_tokens is None else reply.input_tokens,
        output_tokens=produced if reply.output_tokens is None else reply.output_tokens,
    )
    return ModelReply(
        text=storable_text(reply.text),
        tool_calls=calls,
        usage=usage,
        finish_reason="tool_calls" if calls else "stop",
        first_token_at=first,
    )
