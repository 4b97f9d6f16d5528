"""The README's examples as code: its fenced blocks, and its agents loaded
as a module the test workers import.

How the README is executed (tests/test_readme.py):

* Every fenced block is ``python``, ``bash`` or ``text`` (diagrams, never run).
* Python blocks are either *declarations* (tools, agents, scripts: no
  ``client``) or *client* blocks (they use ``client``). The declarations,
  in README order, are executed once per process as this module's body, so
  the workers (``CHORUS_MODULES=tests.agents``, which imports this module)
  and the test process register the very same tools and agents. The client
  blocks then run in order in one namespace that starts as a copy of this
  module's, in the test process, against the test services (``Client()``
  reads the ``CHORUS_*`` variables the test sets).
* The substitutions: an ``Agent("NAME", model="<provider>/...")`` naming
  a real provider gets ``model="scripted/readme-NAME"`` instead, and a
  policy's ``fallback="<provider>/..."`` gets ``"scripted/readme-fallback"``,
  served by the scripts registered below (no network, no key).
* Bash blocks run in bash with ``chorus`` defined as the worktree's CLI and
  ``.venv/bin/`` meaning this interpreter's; README service URLs are
  replaced by the test services'. Blocks that cannot run here are listed in
  tests/test_readme.py with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.llm.scripted import Reply, call, register_script

README = Path(__file__).resolve().parent.parent / "README.md"

_FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", re.M | re.S)
_REAL_MODEL = re.compile(r'(Agent\(\s*"(?P<name>[\w-]+)",\s*model=)"(?!scripted/)[^"]+"')
#: A policy's fallback model naming a real provider (``fallback="<provider>/..."``).
_REAL_FALLBACK = re.compile(r'(fallback=)"(?!scripted/)[^"/]+/[^"]+"')


@dataclass(frozen=True)
class Block:
    """One fenced block of the README."""

    index: int
    lang: str
    body: str
    line: int

    @property
    def is_client(self) -> bool:
        return "client" in self.body

    def __str__(self) -> str:
        first = self.body.strip().splitlines()[0] if self.body.strip() else ""
        return f"README.md:{self.line} ({self.lang}) {first[:60]}"


def blocks() -> list[Block]:
    text = README.read_text()
    return [
        Block(i, m["lang"], m["body"], text.count("\n", 0, m.start()) + 1)
        for i, m in enumerate(_FENCE.finditer(text))
    ]


def scripted(source: str) -> str:
    """The README source with every real provider model replaced by its
    agent's script, ``scripted/readme-<agent name>``, and a policy's
    ``fallback="<provider>/..."`` by ``scripted/readme-fallback``."""
    source = _REAL_MODEL.sub(lambda m: f'{m[1]}"scripted/readme-{m["name"]}"', source)
    return _REAL_FALLBACK.sub(lambda m: f'{m[1]}"scripted/readme-fallback"', source)


def _tool_results(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in messages if m.get("role") == "tool"]


register_script(
    "readme-planner",
    [
        Reply.call(call("forecast", city="Lisbon"), call("book", city="Lisbon")),
        lambda ms: Reply.say("Lisbon, three nights: " + "; ".join(_tool_results(ms))),
        Reply.say("Four nights in Lisbon, rebooked."),
    ],
)
register_script("readme-web-researcher", [Reply.say("Lisbon has a new tram line.")] * 50)
register_script(
    "readme-team-lead",
    [
        Reply.call(call("subagent__web-researcher", task="news from Lisbon")),
        lambda ms: Reply.say("Researched: " + _tool_results(ms)[-1]),
    ],
)
register_script(
    "readme-crawler",
    [
        Reply.call(*(call("fetch_page", url=f"https://example.com/{i}") for i in range(12))),
        lambda ms: Reply.say(f"{len(_tool_results(ms))} pages checked, all up."),
    ],
)
register_script(
    "readme-careful-planner",
    [
        Reply.call(call("forecast", city="Lisbon")),
        Reply.call(call("final_answer", city="Lisbon", nights=3)),
    ]
    + [Reply.say("Lisbon, three nights.")] * 10,  # e.g. a checkpoint's briefing
)


def _todos(*statuses: str) -> dict[str, Any]:
    titles = ("Check the weather", "Book")
    return {
        "todos": [
            {"id": i, "title": t, "status": s}
            for i, (t, s) in enumerate(zip(titles, statuses, strict=True), 1)
        ]
    }


register_script(
    "readme-todo-planner",
    [
        Reply.call(
            call("manage_todo_list", **_todos("in-progress", "not-started")),
            call("forecast", city="Lisbon"),
        ),
        Reply.call(
            call("manage_todo_list", **_todos("completed", "in-progress")),
            call("book", city="Lisbon"),
        ),
        Reply.call(call("manage_todo_list", **_todos("completed", "completed"))),
        Reply.say("Lisbon, three nights, booked."),
    ],
)
register_script(
    "readme-help-desk",
    [Reply.call(call("handoff__billing", message="a refund of order 42"))],
)
register_script(
    "readme-billing",
    [
        Reply.say("Billing here."),
        Reply.call(call("refund", order="42")),
        lambda ms: Reply.say("Done: " + _tool_results(ms)[-1]),
    ],
)


register_script(
    "readme-accountant",
    [
        Reply.call(call("pay_invoice", invoice="INV-7", amount=120)),
        lambda ms: Reply.say("Paid: " + _tool_results(ms)[-1]),
    ],
)
register_script(
    "readme-travel-agent",
    [
        Reply.call(
            call("airline__fare", origin="Lisbon", destination="JFK"),
            call("airline__fare", origin="LIS", destination="JFK"),
            call("atlas__list_all_airports", country="PT"),
        ),
        lambda ms: Reply.say(" | ".join(_tool_results(ms))),
    ],
)


def _read_line_4000(messages: list[dict[str, Any]]) -> Reply:
    handle = re.findall(r'handle="([0-9a-f]+)"', _tool_results(messages)[-1])[0]
    return Reply.call(call("read_tool_output", handle=handle, offset=4000 * 14, length=14))


register_script(
    "readme-log-reader",
    [
        Reply.call(call("fetch_log", service="api")),
        _read_line_4000,
        lambda ms: Reply.say("It reads: " + _tool_results(ms)[-1].splitlines()[-1]),
    ],
)
register_script(
    "readme-weather-planner",
    [
        Reply.call(call("weather__forecast", city="Lisbon")),
        lambda ms: Reply.say("Lisbon: " + _tool_results(ms)[-1]),
    ],
)


def _overloaded(_messages: list[dict[str, Any]]) -> Reply:
    from litellm.llms.custom_llm import CustomLLMError  # imported where a model is called

    raise CustomLLMError(status_code=503, message="overloaded")


register_script("readme-support", [_overloaded])  # every call answers 503
register_script(
    "readme-fallback",
    [lambda ms: Reply.say("Fallback model here. You wrote: " + str(ms[-1]["content"]))],
)

# The README's declarations, in order, as this module's body.
exec(
    compile(
        "\n\n".join(scripted(b.body) for b in blocks() if b.lang == "python" and not b.is_client),
        str(README),
        "exec",
    ),
    globals(),
)
