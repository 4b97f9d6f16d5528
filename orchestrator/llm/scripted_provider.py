"""The scripted model as a litellm custom provider (``scripted/<name>``):
what :mod:`orchestrator.llm.scripted` registers, answered through litellm's
real code path. Imported only by :func:`orchestrator.llm.scripted.install`,
on a process's first model call, so registering scripts costs no litellm.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from litellm.llms.custom_llm import CustomLLM, CustomLLMError
from litellm.types.utils import (
    ChatCompletionMessageToolCall,
    Choices,
    Function,
    GenericStreamingChunk,
    ModelResponse,
    Usage,
)
from litellm.types.utils import Message as LiteLLMMessage

from orchestrator.llm.script import (
    PROVIDER,
    Reply,
    ScriptFailure,
    _lock,
    _scripts,
    _tools,
    play,
    prompt_tokens,
    text_pieces,
    words,
)

__all__ = ["ScriptError", "ScriptedLLM", "install"]


class ScriptError(CustomLLMError):
    """The script cannot answer (unknown, exhausted, or a reply function failed).

    Status 400: litellm surfaces it as ``BadRequestError``, which is not
    retryable, because asking again would fail the same way.
    """

    def __init__(self, message: str) -> None:
        super().__init__(status_code=400, message=message)


def _select(model: str, messages: list[dict[str, Any]]) -> Reply:
    """Pick the reply for this conversation (index = assistant messages so far)."""
    with _lock:
        script = _scripts.get(model)
        known = sorted(_scripts)
    if script is None:
        raise ScriptError(f"no script named {model!r} is registered; registered: {known}")
    try:
        return play(model, script, messages, passthrough=(CustomLLMError,))
    except ScriptFailure as exc:
        raise ScriptError(str(exc)) from exc.__cause__


@dataclass(frozen=True)
class _Answer:
    """A reply resolved for one call: ids assigned, usage counted."""

    text: str
    calls: list[tuple[str, str, str]]  # (id, name, arguments)
    prompt_tokens: int
    completion_tokens: int

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.calls else "stop"

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
        )


def _answer(
    model: str, messages: list[dict[str, Any]], optional_params: dict[str, Any] | None = None
) -> _Answer:
    token = _tools.set(tuple((optional_params or {}).get("tools") or ()))
    try:
        reply = _select(model, messages)
    finally:
        _tools.reset(token)
    calls = [(c.id or f"call_{uuid.uuid4().hex}", c.tool, c.arguments()) for c in reply.tool_calls]
    produced = words(reply.text) + sum(1 + words(args) for _, _, args in calls)
    return _Answer(
        text=reply.text,
        calls=calls,
        prompt_tokens=(
            reply.input_tokens if reply.input_tokens is not None else prompt_tokens(messages)
        ),
        completion_tokens=reply.output_tokens if reply.output_tokens is not None else produced,
    )


def _chunk(text: str = "", **extra: Any) -> GenericStreamingChunk:
    chunk: GenericStreamingChunk = {
        "text": text,
        "tool_use": None,
        "is_finished": False,
        "finish_reason": "",
        "usage": None,
        "index": 0,
    }
    chunk.update(extra)  # type: ignore[typeddict-item]
    return chunk


def _stream(answer: _Answer) -> Iterator[GenericStreamingChunk]:
    for piece in text_pieces(answer.text):
        yield _chunk(piece)
    for index, (call_id, name, args) in enumerate(answer.calls):
        half = len(args) // 2
        head: dict[str, Any] = {"name": name, "arguments": args[:half]}
        tail: dict[str, Any] = {"name": None, "arguments": args[half:]}
        for call_id_part, function in ((call_id, head), (None, tail)):
            tool_use = {
                "id": call_id_part,
                "type": "function",
                "function": function,
                "index": index,
            }
            yield _chunk(tool_use=tool_use)
    usage = {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
    }
    yield _chunk(is_finished=True, finish_reason=answer.finish_reason, usage=usage)


def _response(model: str, answer: _Answer) -> ModelResponse:
    tool_calls = [
        ChatCompletionMessageToolCall(
            id=call_id, type="function", function=Function(name=name, arguments=args)
        )
        for call_id, name, args in answer.calls
    ]
    message = LiteLLMMessage(
        role="assistant", content=answer.text or None, tool_calls=tool_calls or None
    )
    return ModelResponse(
        model=model,
        choices=[Choices(index=0, finish_reason=answer.finish_reason, message=message)],
        usage=answer.usage(),
    )


class ScriptedLLM(CustomLLM):
    """The litellm custom provider that plays registered scripts."""

    def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """Answer without streaming."""
        model, messages = kwargs["model"], kwargs["messages"]
        return _response(model, _answer(model, messages, kwargs.get("optional_params")))

    def streaming(self, *args: Any, **kwargs: Any) -> Iterator[GenericStreamingChunk]:
        """Answer as a stream (errors raise here, before the first chunk)."""
        return _stream(_answer(kwargs["model"], kwargs["messages"], kwargs.get("optional_params")))

    async def acompletion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """Answer without streaming, async."""
        return self.completion(*args, **kwargs)

    def astreaming(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[GenericStreamingChunk]:
        """Answer as an async stream; litellm iterates the returned iterator."""
        return _astream(_answer(kwargs["model"], kwargs["messages"], kwargs.get("optional_params")))


async def _astream(answer: _Answer) -> AsyncIterator[GenericStreamingChunk]:
    for chunk in _stream(answer):
        yield chunk


_handler = ScriptedLLM()


def install() -> None:
    """Register the ``scripted`` provider with litellm; cheap when already done."""
    providers = litellm.custom_provider_map
    if any(item.get("provider") == PROVIDER for item in providers):
        return
    with _lock:
        if not any(item.get("provider") == PROVIDER for item in providers):
            providers.append({"provider": PROVIDER, "custom_handler": _handler})
    litellm.utils.custom_llm_setup()
