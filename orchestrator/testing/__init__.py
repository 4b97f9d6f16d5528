"""Test your agents without a fleet: Chorus in the test process.

:class:`Harness` gives a normal :class:`~orchestrator.Client` whose jobs run
inline (:class:`InlineDispatcher`) on a temporary SQLite store and an
embedded Redis, with a model you write in Python (:class:`FunctionModel`)
or script (:class:`ScriptedModel`)::

    from orchestrator.testing import FunctionModel, Harness, ModelRequest, Reply, call

    def model(request: ModelRequest) -> Reply | str:
        if not request.tool_results:
            return Reply.call(call("add", a=2, b=3))
        return f"2 + 3 = {request.tool_results[0]}"

    with Harness(modules=["myapp.agents"], model=FunctionModel(model)) as h:
        assert h.client.submit("calculator", "2+3?").result() == "2 + 3 = 5"
"""

from orchestrator.llm.client import LiteLLMClient, ModelClient
from orchestrator.llm.function import FunctionModel, ModelFunction, ModelRequest, ScriptedModel
from orchestrator.llm.script import Reply, ScriptedToolCall, call
from orchestrator.testing.harness import Harness
from orchestrator.testing.inline import InlineDispatcher

__all__ = [
    "FunctionModel",
    "Harness",
    "InlineDispatcher",
    "LiteLLMClient",
    "ModelClient",
    "ModelFunction",
    "ModelRequest",
    "Reply",
    "ScriptedModel",
    "ScriptedToolCall",
    "call",
]
