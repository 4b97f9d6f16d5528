"""An agent only one test's worker registers: it stops, and the agent with it."""

from __future__ import annotations

from orchestrator import Agent
from orchestrator.llm.scripted import scripted_model

Agent("retired", scripted_model("quick"))
