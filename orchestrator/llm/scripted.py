"""A deterministic scripted model, reached through litellm's real code path.

The model is a litellm custom provider named ``scripted``. A *script* is a
list of replies registered under a name; ``litellm.completion(model=
"scripted/<name>", ...)`` answers with the reply whose index is the number
of assistant messages already in the conversation it receives. So the first
call of a turn gets reply 0, the call after one tool round gets reply 1, and
so on, whatever process makes the call, as long as that process registered
the same script (register scripts at import time of a module the workers
load, e.g. one listed in ``CHORUS_MODULES``).

Example::

    register_script("weather", [
        Reply.call(call("get_weather", city="Paris")),
        lambda messages: Reply.say(f"The tool said: {messages[-1]['content']}"),
    ])
    litellm.completion(model=scripted_model("weather"), messages=..., stream=True)

Streaming sends the text in word-sized pieces and each tool call in two
pieces (id and name with the first half of the arguments, then the rest), so
consumers exercise the same accumulation as with a real provider. Usage is a
rough word count: prompt words in, reply words out, unless the reply sets it.

A reply function can read the ``tools=`` of the call it answers with
:func:`offered_tools` (as the provider received them).

Tool calls are emitted even when the tool is not in ``tools=`` and their
arguments may be any raw string (``ScriptedToolCall(tool, "{not json")``):
tests use both to simulate a misbehaving model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.llm.script import (
    PROVIDER,
    Reply,
    ScriptedToolCall,
    ScriptItem,
    call,
    offered_tools,
    register_script,
    scripted_model,
    unregister_script,
)

if TYPE_CHECKING:
    from orchestrator.llm.scripted_provider import ScriptedLLM, ScriptError

__all__ = [
    "PROVIDER",
    "Reply",
    "ScriptError",
    "ScriptItem",
    "ScriptedLLM",
    "ScriptedToolCall",
    "call",
    "install",
    "offered_tools",
    "register_script",
    "scripted_model",
    "unregister_script",
]


def install() -> None:
    """Register the ``scripted`` provider with litellm (imported here, on the
    first model call, not when a module registers its scripts); cheap when
    already done."""
    from orchestrator.llm import scripted_provider

    scripted_provider.install()


def __getattr__(name: str) -> Any:
    """The litellm-bound names (:class:`ScriptError`, :class:`ScriptedLLM`),
    imported on first use."""
    if name in ("ScriptError", "ScriptedLLM"):
        from orchestrator.llm import scripted_provider

        return getattr(scripted_provider, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
