"""Tools, scripts and agents the test workers register (CHORUS_MODULES=tests.agents)."""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

import examples.parallel_tools  # noqa: F401  (the example agent, for the end-to-end test)
from orchestrator import Agent, ToolContext, tool
from orchestrator.llm.scripted import Reply, ScriptedToolCall, call, register_script, scripted_model
from schemas import RateLimit
from schemas.specs import RetryPolicy


def tool_results(messages: list[dict[str, Any]]) -> list[Any]:
    """Every tool result the model was shown, oldest first (JSON decoded)."""
    out: list[Any] = []
    for m in messages:
        if m.get("role") == "tool":
            try:
                out.append(json.loads(m["content"]))
            except ValueError:
                out.append(m["content"])
    return out


def echo_results(messages: list[dict[str, Any]]) -> Reply:
    return Reply.say("results: " + json.dumps(tool_results(messages)))


# -- ordering: parallel calls overlap, a barrier runs alone -------------------


def _slept(label: str, seconds: float) -> dict[str, Any]:
    start = time.time()
    time.sleep(seconds)
    return {"label": label, "start": start, "end": time.time()}


@tool
def timed(label: str, seconds: float = 0.5) -> dict[str, Any]:
    """Sleep and report when it ran.

    Args:
        label: a name for this call.
        seconds: how long to sleep.
    """
    return _slept(label, seconds)


@tool(parallelizable=False)
def timed_barrier(label: str, seconds: float = 0.3) -> dict[str, Any]:
    """Like timed, but never runs beside another call.

    Args:
        label: a name for this call.
        seconds: how long to sleep.
    """
    return _slept(label, seconds)


register_script(
    "ordering",
    [
        Reply.call(
            call("timed", label="p1"),
            call("timed", label="p2"),
            call("timed", label="p3"),
            call("timed_barrier", label="b"),
            call("timed", label="q1"),
            call("timed", label="q2"),
        ),
        echo_results,
    ],
)
Agent("ordering", scripted_model("ordering"), tools=[timed, timed_barrier])


# -- durability: a batch slow enough to kill a worker under it ---------------

register_script(
    "slow-batch",
    [
        Reply.call(*(call("timed", label=f"s{i}", seconds=4.0) for i in range(3))),
        echo_results,
    ],
)
Agent("slow-batch", scripted_model("slow-batch"), tools=[timed])


# -- bad model output and failing tools --------------------------------------


@tool
def explode(reason: str) -> str:
    """Always raises.

    Args:
        reason: what to say.
    """
    raise RuntimeError(f"exploded: {reason}")


@tool(timeout=0.5)
def hang(seconds: float) -> str:
    """Sleeps longer than its timeout.

    Args:
        seconds: how long.
    """
    time.sleep(seconds)
    return "woke up"


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first.
        b: second.
    """
    return a + b


register_script(
    "misbehaving",
    [
        Reply.call(
            call("no_such_tool", x=1),
            call("add", a="not a number", b=2),
            ScriptedToolCall(tool="add", params="{not json"),
            call("explode", reason="on purpose"),
            call("hang", seconds=5),
            call("add", a=2, b=3),
        ),
        echo_results,
    ],
)
Agent("misbehaving", scripted_model("misbehaving"), tools=[add, explode, hang])

#: Calls of one reply of "sprawling": past CHORUS_MAX_REPLY_TOOL_CALLS (1,000 by
#: default), and their two events each (9 parameters an event) past the 65,535
#: parameters one statement may carry.
SPRAWL = 3700
register_script(
    "sprawling",
    [
        Reply.call(*(call("no_such_tool", i=i) for i in range(SPRAWL))),
        lambda ms: Reply.say(f"results: {len(tool_results(ms))}"),
    ],
)
Agent("sprawling", scripted_model("sprawling"), tools=[add])


# -- context and multi-turn --------------------------------------------------


@tool
def whoami(ctx: ToolContext) -> dict[str, Any]:
    """Report the call's context."""
    return {
        "conversation_id": ctx.conversation_id,
        "tool_request_id": ctx.tool_request_id,
        "context_data": ctx.context_data,
    }


def _count_user_texts(messages: list[dict[str, Any]]) -> Reply:
    texts = [m["content"] for m in messages if m["role"] == "user"]
    return Reply.say(f"I have seen {len(texts)} user messages: {' | '.join(texts)}")


register_script(
    "chatty",
    [Reply.call(call("whoami")), echo_results, _count_user_texts, _count_user_texts],
)
Agent("chatty", scripted_model("chatty"), tools=[whoami])

# every turn: whoami, then answer with the context_data the tool saw
register_script(
    "tenant-echo",
    [
        Reply.call(call("whoami")),
        lambda ms: Reply.say(json.dumps(tool_results(ms)[-1]["context_data"], sort_keys=True)),
    ]
    * 50,
)
Agent("tenant-echo", scripted_model("tenant-echo"), tools=[whoami])


# -- the sweeper: a whole worker dies, its unacked tasks stay with Redis ------


@tool(timeout=3.0)
def brief(label: str, seconds: float = 2.0) -> dict[str, Any]:
    """Sleep a little (its timeout is short, so a lost call is soon stalled).

    Args:
        label: a name for this call.
        seconds: how long to sleep.
    """
    return _slept(label, seconds)


register_script(
    "fragile-batch",
    [Reply.call(*(call("brief", label=f"f{i}") for i in range(2))), echo_results],
)
Agent("fragile-batch", scripted_model("fragile-batch"), tools=[brief])


# -- subagents ----------------------------------------------------------------


def _task(messages: list[dict[str, Any]]) -> str:
    """The first user message: a child's task."""
    return next(str(m["content"]) for m in messages if m["role"] == "user")


register_script(
    "researcher",
    [
        lambda ms: Reply.call(call("timed", label=_task(ms), seconds=1.0)),
        lambda ms: Reply.say(f"researched {_task(ms)}: {json.dumps(tool_results(ms)[-1])}"),
    ],
)
Agent("researcher", scripted_model("researcher"), system="You research one topic.", tools=[timed])

register_script(
    "deep-researcher",
    [
        lambda ms: Reply.call(call("subagent__researcher", task=f"inner {_task(ms)}")),
        lambda ms: Reply.say(f"deep: {tool_results(ms)[-1]}"),
    ],
)
Agent("deep-researcher", scripted_model("deep-researcher"), subagents=["researcher"])

register_script(
    "lead",
    [
        Reply.call(
            call("subagent__researcher", task="alpha"),
            call("subagent__researcher", task="beta"),
            call("subagent__deep-researcher", task="gamma"),
        ),
        echo_results,
    ],
)
Agent("lead", scripted_model("lead"), subagents=["researcher", "deep-researcher"])

register_script("echo-child", [lambda ms: Reply.say(f"done {_task(ms)}")])
Agent("echo-child", scripted_model("echo-child"))

FANOUT = 201  # one more than the test workers' CHORUS_MAX_CHILDREN
register_script(
    "fanout",
    [
        Reply.call(*(call("subagent__echo-child", task=f"t{i}") for i in range(FANOUT))),
        echo_results,
    ],
)
Agent("fanout", scripted_model("fanout"), subagents=["echo-child"])

SMALL_FANOUT = 20  # tests/integration/test_step_queries.py counts its statements
register_script(
    "small-fanout",
    [
        Reply.call(*(call("subagent__echo-child", task=f"t{i}") for i in range(SMALL_FANOUT))),
        lambda ms: Reply.say(f"children={len(tool_results(ms))}"),
    ],
)
Agent("small-fanout", scripted_model("small-fanout"), subagents=["echo-child"])

register_script(
    "diver",
    [
        lambda ms: Reply.call(call("subagent__diver", task="deeper")),
        lambda ms: Reply.say(f"from below: {tool_results(ms)[-1]}"),
    ],
)
Agent("diver", scripted_model("diver"), subagents=["diver"])

register_script(
    "sleepy-child",
    [lambda ms: Reply.call(call("timed", label="child", seconds=4.0)), echo_results],
)
Agent("sleepy-child", scripted_model("sleepy-child"), tools=[timed])

register_script(
    "busy-lead",
    [
        Reply.call(
            call("timed", label="parent", seconds=4.0),
            call("subagent__sleepy-child", task="nap"),
        ),
        echo_results,
    ],
)
Agent("busy-lead", scripted_model("busy-lead"), tools=[timed], subagents=["sleepy-child"])


# -- tool durability: stops reaching threads-pool tools, crashing tools, ids --


@tool(queue="cut", timeout=60.0)
def cut_sleep(label: str, seconds: float = 30.0) -> dict[str, Any]:
    """Sleep on the ``cut`` queue (served by a threads worker in the tests).

    Args:
        label: a name for this call.
        seconds: how long to sleep.
    """
    return _slept(label, seconds)


register_script("cut-child", [Reply.call(call("cut_sleep", label="child")), echo_results])
Agent("cut-child", scripted_model("cut-child"), tools=[cut_sleep])
register_script(
    "cut-lead",
    [
        Reply.call(call("cut_sleep", label="parent"), call("subagent__cut-child", task="nap")),
        echo_results,
    ],
)
Agent("cut-lead", scripted_model("cut-lead"), tools=[cut_sleep], subagents=["cut-child"])


@tool
def crash_process(ctx: ToolContext) -> str:
    """Note the run in the file ``context_data["runs"]``, then SIGKILL its own process."""
    with open(ctx.context_data["runs"], "a") as f:
        f.write(f"{os.getpid()}\n")
    os.kill(os.getpid(), 9)
    return "unreachable"


register_script("crasher", [Reply.call(call("crash_process"), call("add", a=2, b=3)), echo_results])
Agent("crasher", scripted_model("crasher"), tools=[crash_process, add])


@tool
def crash_twice(ctx: ToolContext) -> str:
    """Note the run (and the key it got) in ``context_data["runs"]``;
    SIGKILL its own process on the first two runs, answer on the third."""
    path = ctx.context_data["runs"]
    with open(path, "a") as f:
        f.write(f"{ctx.tool_request_id}\n")
    with open(path) as f:
        runs = len(f.read().split())
    if runs <= 2:
        os.kill(os.getpid(), 9)
    return f"ran {runs} times"


register_script("sometimes-crasher", [Reply.call(call("crash_twice")), echo_results])
Agent("sometimes-crasher", scripted_model("sometimes-crasher"), tools=[crash_twice])
# a subagent whose tool kills its process every time, beside a sibling tool
register_script(
    "crash-lead",
    [Reply.call(call("subagent__crasher", task="go"), call("add", a=1, b=1)), echo_results],
)
Agent("crash-lead", scripted_model("crash-lead"), tools=[add], subagents=["crasher"])


@tool(queue="crash-threads", timeout=2.0)
def crash_worker(ctx: ToolContext) -> str:
    """Note the run in ``context_data["runs"]``, then SIGKILL its process
    (served by a threads worker: the whole worker)."""
    with open(ctx.context_data["runs"], "a") as f:
        f.write(f"{os.getpid()}\n")
    os.kill(os.getpid(), 9)
    return "unreachable"


register_script("worker-crasher", [Reply.call(call("crash_worker")), echo_results])
Agent("worker-crasher", scripted_model("worker-crasher"), tools=[crash_worker])

register_script(
    "same-ids",  # a provider that numbers its calls per reply: ids repeat
    [
        Reply.call(
            ScriptedToolCall("whoami", {}, id="call_0"), ScriptedToolCall("whoami", {}, id="call_0")
        ),
        Reply.call(ScriptedToolCall("whoami", {}, id="call_0")),
        echo_results,
    ],
)
Agent("same-ids", scripted_model("same-ids"), tools=[whoami])


# -- queued messages: every turn makes one short tool call, then answers -------


def _looping(messages: list[dict[str, Any]]) -> Reply:
    last = messages[-1]
    if last["role"] == "tool":
        said = [m["content"] for m in messages if m["role"] == "user"][-1]
        return Reply.say(f"done: {said}")
    return Reply.call(call("timed", label=str(last["content"]), seconds=0.3))


register_script("looper", [_looping] * 400)
Agent("looper", scripted_model("looper"), tools=[timed])
register_script("quick", [lambda ms: Reply.say(f"ok: {ms[-1]['content']}")] * 400)
Agent("quick", scripted_model("quick"))


def _slow_answer(messages: list[dict[str, Any]]) -> Reply:
    """A model that thinks for 5 s: its step holds the conversation's lease
    meanwhile (a test restarts Postgres under it)."""
    time.sleep(5.0)
    return Reply.say(f"slow: {messages[-1]['content']}")


register_script("slow-answer", [_slow_answer])
Agent("slow-answer", scripted_model("slow-answer"))

register_script("failing-child", [])  # its first model call fails: the script is empty
Agent("failing-child", scripted_model("failing-child"))
register_script(
    "careful-lead",
    [Reply.call(call("subagent__failing-child", task="try"), call("add", a=1, b=2)), echo_results],
)
Agent("careful-lead", scripted_model("careful-lead"), tools=[add], subagents=["failing-child"])

register_script("recall", [lambda ms: Reply.say(f"you said: {_task(ms)}")] * 3)
Agent("recall", scripted_model("recall"))
register_script(
    "forker",
    [
        Reply.call(
            ScriptedToolCall(tool="subagent__recall", params={"task": "what?", "fork": True}),
            ScriptedToolCall(tool="subagent__recall", params={"task": "fresh", "fork": False}),
        ),
        echo_results,
    ],
)
Agent("forker", scripted_model("forker"), subagents=["recall"])


# -- structured output --------------------------------------------------------


class Trip(BaseModel):
    city: str
    nights: int = Field(ge=1)


def _after_rejection(ms: list[dict[str, Any]]) -> Reply:
    seen = str(tool_results(ms)[-1])
    if "does not match the schema" not in seen or "nights" not in seen:
        return Reply.say(f"never saw the validation error: {seen}")
    return Reply.call(call("final_answer", city="Lisbon", nights=3))


register_script(
    "extractor",
    [
        Reply.say("Lisbon, three nights."),  # text where a final answer is required
        Reply.call(call("final_answer", city="Lisbon", nights="three")),  # invalid
        _after_rejection,
    ],
)
Agent("extractor", scripted_model("extractor"), output=Trip)
register_script("stubborn", [Reply.call(call("final_answer", city="Lisbon"))] * 5)
Agent("stubborn", scripted_model("stubborn"), output=Trip)


# -- budgets ------------------------------------------------------------------

register_script(
    "priced-child", [Reply(text="expensive answer", input_tokens=100, output_tokens=100)] * 3
)
Agent(  # 0.30 USD a call: a price for the scripted child, so its calls cost something
    "priced-child",
    scripted_model("priced-child"),
    model_settings={"input_cost_per_token": 0.001, "output_cost_per_token": 0.002},
)
register_script(
    "budget-lead",
    [
        Reply.call(*(call("subagent__priced-child", task=f"c{i}") for i in range(3))),
        echo_results,
    ],
)
Agent("budget-lead", scripted_model("budget-lead"), subagents=["priced-child"])

#: Tokens each model call of "metered-walker" reports (10 in, 10 out): a
#: tokens budget stops it at a known step.
METERED_TOKENS = 20
METERED_STEPS = 10  # its model calls when nothing stops it
register_script(
    "metered-walker",
    [
        Reply(tool_calls=[call("add", a=i, b=1)], input_tokens=10, output_tokens=10)
        for i in range(METERED_STEPS - 1)
    ]
    + [Reply(text="walked the whole way", input_tokens=10, output_tokens=10)],
)
Agent("metered-walker", scripted_model("metered-walker"), tools=[add])


def _without_tools(ms: list[dict[str, Any]]) -> Reply:
    if "tool-call budget of this job is spent" in ms[0]["content"]:
        return Reply.say(f"out of tools: {json.dumps(tool_results(ms))}")
    return Reply.call(call("add", a=1, b=1))


register_script(
    "toolhungry",
    [
        Reply.call(call("add", a=1, b=2), call("add", a=3, b=4), call("add", a=5, b=6)),
        _without_tools,
    ],
)
Agent("toolhungry", scripted_model("toolhungry"), system="Add things.", tools=[add])


# -- rate limits --------------------------------------------------------------

RATE = 5  # model calls a second, across every worker
register_script("limited", [lambda ms: Reply.say(f"ok {ms[-1]['content']}")] * 3)
Agent(
    "limited",
    scripted_model("limited"),
    rate_limits=[RateLimit(key="tenant:{tenant}", requests=RATE, period=1.0)],
)


# -- core: a step that fails the same way on every attempt ---------------------
# (the context transformer raises; the turn must fail, not loop)

from orchestrator import registry  # noqa: E402
from orchestrator.context import TransformContext, context_transformer  # noqa: E402
from schemas import AgentSpec, Message  # noqa: E402

CORE_BOOM = "core-explodes: this transformer always fails"


@context_transformer("core-explodes")
def core_explodes(history: list[Message], ctx: TransformContext) -> list[Message]:
    raise RuntimeError(CORE_BOOM)


register_script("core-broken", [Reply.say("never reached")])
registry.register_agent(
    AgentSpec(name="core-broken", model=scripted_model("core-broken"), context=("core-explodes",))
)

register_script(
    "core-broken-lead",
    [Reply.call(call("subagent__core-broken", task="try")), echo_results],
)
registry.register_agent(
    AgentSpec(
        name="core-broken-lead",
        model=scripted_model("core-broken-lead"),
        subagents=("core-broken",),
    )
)


# -- tokens: a tool-heavy agent's requests are mostly schema, arguments and ----
# -- structured results, with little message text ------------------------------


@tool
def ledger(entries: list[str], note: str = "") -> dict[str, Any]:
    """Store ledger entries and return each one itemized, with its size.

    Each entry is one line of a ledger: a date, a counterparty, an amount and
    a free-text memo, separated by semicolons. Entries are stored in the order
    given, numbered from zero, and returned itemized so that the caller can
    check what was recorded against what it meant to record. The note, when
    given, is stored with the whole batch and returned unchanged. Amounts are
    not validated or summed here: a separate reconciliation tool does that,
    and the ledger only guarantees that every entry it acknowledges is kept
    exactly as sent. Call it once per batch rather than once per entry; a
    batch of a few dozen entries is fine. Entries that repeat an earlier one
    are stored again, never merged.

    Args:
        entries: the ledger lines to store, in order, one string per entry,
            each as "date; counterparty; amount; memo".
        note: an optional note stored with the whole batch.
    """
    items = [{"n": i, "entry": e, "chars": len(e)} for i, e in enumerate(entries)]
    return {"stored": len(entries), "items": items, "note": note}


# -- sec: tool authorization and hostile input ---------------------------------


@tool
def leave_mark(ctx: ToolContext) -> str:
    """Write a file at context_data["mark"]: proof that the tool ran."""
    with open(ctx.context_data["mark"], "a") as f:
        f.write("ran\n")
    return "marked"


register_script(
    "sec-intruder",
    [
        Reply.call(
            call("weather", city="Lisbon"),
            call("leave_mark"),
            call("subagent__echo-child", task="sneak"),
            call("final_answer", anything=1),
            call("add", a=1, b=2),
        ),
        echo_results,
    ],
)
Agent("sec-intruder", scripted_model("sec-intruder"), tools=[add])
register_script("sec-marker", [Reply.call(call("leave_mark")), echo_results])
Agent("sec-marker", scripted_model("sec-marker"), tools=[leave_mark])


@tool
def echo_back(value: Any = None) -> Any:
    """Return its argument unchanged.

    Args:
        value: anything.
    """
    return value


def _hostile_call(messages: list[dict[str, Any]]) -> Reply:
    """Call echo_back with the user's message as the raw argument string."""
    return Reply.call(ScriptedToolCall(tool="echo_back", params=_task(messages)))


def _say_results_raw(messages: list[dict[str, Any]]) -> Reply:
    """Text that repeats the results, with a NUL and a lone surrogate of its own."""
    return Reply.say("saw\x00\ud800: " + repr(tool_results(messages))[:5000])


register_script("sec-hostile-args", [_hostile_call, _say_results_raw] * 200)
Agent("sec-hostile-args", scripted_model("sec-hostile-args"), tools=[echo_back])

#: Credentials in a tool's error by shape (a pair, a GitHub token); the
#: tool adds the workers' own Groq key (tests.conftest.PROVIDER_KEY).
LEAKED_PAIR_VALUE = "hunter2-not-shown"
LEAKED_TOKEN = "ghp_Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"


@tool
def leaky(fail: bool) -> str:
    """Fail with credentials in the message, or return the workers' key.

    Args:
        fail: raise instead of returning.
    """
    key = os.environ["GROQ_API_KEY"]
    if fail:
        raise RuntimeError(f"refused api_key={LEAKED_PAIR_VALUE} with {LEAKED_TOKEN} for {key}")
    return f"configured with {key}"


# -- tree: redelivered tool copies, stops racing steps, per-job fan-out, deadlines --

register_script(
    "redeliver",
    [
        Reply.call(call("add", a=1, b=2), call("timed", label="slow", seconds=4.0)),
        echo_results,
    ],
)
Agent("redeliver", scripted_model("redeliver"), tools=[add, timed])

register_script(
    "stoppable-child",
    [lambda ms: Reply.call(call("timed", label=_task(ms), seconds=0.7)), echo_results],
)
Agent("stoppable-child", scripted_model("stoppable-child"), tools=[timed])
register_script(
    "stoppable-lead",
    [
        Reply.call(
            call("timed", label="lead", seconds=1.5),
            *(call("subagent__stoppable-child", task=f"c{i}") for i in range(4)),
        ),
        lambda ms: Reply.call(call("subagent__stoppable-child", task="again")),
        echo_results,
    ],
)
Agent(
    "stoppable-lead",
    scripted_model("stoppable-lead"),
    tools=[timed],
    subagents=["stoppable-child"],
)


def _spawn(messages: list[dict[str, Any]]) -> Reply:
    """'spawn N': call N echo children, then report this turn's results."""
    if messages[-1]["role"] == "tool":
        asked = max(i for i, m in enumerate(messages) if m["role"] == "user")
        return Reply.say("children: " + json.dumps(tool_results(messages[asked:])))
    count = int(str(messages[-1]["content"]).split()[-1])
    return Reply.call(*(call("subagent__echo-child", task=f"k{i}") for i in range(count)))


register_script("spawner", [_spawn] * 400)
Agent("spawner", scripted_model("spawner"), subagents=["echo-child"])

register_script(
    "overtime",
    [Reply.call(call("timed", label="long", seconds=30.0)), echo_results],
)
Agent("overtime", scripted_model("overtime"), tools=[timed])

register_script(
    "swarm-lead",
    [
        Reply.call(
            call("timed", label="lead", seconds=2.0),
            *(call("subagent__echo-child", task=f"s{i}") for i in range(12)),
        ),
        Reply.call(*(call("subagent__stoppable-child", task=f"t{i}") for i in range(6))),
        echo_results,
    ],
)
Agent(
    "swarm-lead",
    scripted_model("swarm-lead"),
    tools=[timed],
    subagents=["echo-child", "stoppable-child"],
)


# -- client: defaults, many waiters, verbatim CLI output ------------------------

LONG_WALK = 30  # model calls in one turn, past the old max_steps default of 25
register_script(
    "long-walker",
    [Reply.call(call("add", a=i, b=1)) for i in range(LONG_WALK - 1)]
    + [lambda ms: Reply.say(f"walked {len(tool_results(ms))} steps")],
)
Agent("long-walker", scripted_model("long-walker"), tools=[add])  # default max_steps

register_script(
    "waited",
    [
        Reply.call(call("timed", label="wait", seconds=2.0)),
        lambda ms: Reply.say(f"waited for {_task(ms)}"),
    ],
)
Agent("waited", scripted_model("waited"), tools=[timed])

#: Rich markup, a closing tag that crashes markup parsing, and one line
#: longer than a terminal: printed verbatim or the CLI is wrong.
VERBATIM = "[bold]not bold[/bold] a tag [/] and [link]x[/link] " + "long-line " * 20 + "end"
register_script("verbatim", [Reply.say(VERBATIM)] * 50)
Agent("verbatim", scripted_model("verbatim"))

# -- client: the README's tools and agents (tests/readme.py) -----------------

import tests.readme  # noqa: E402,F401

# -- sweep: a slow model for a busy queue; a rate limit that defers steps -----


def _slow_answer(messages: list[dict[str, Any]]) -> Reply:
    time.sleep(0.5)
    return Reply.say(f"slow: {messages[-1]['content']}")


register_script("sweep-slow", [_slow_answer])
Agent("sweep-slow", scripted_model("sweep-slow"))
register_script("sweep-deferred", [lambda ms: Reply.say(f"deferred: {ms[-1]['content']}")])
Agent(
    "sweep-deferred",
    scripted_model("sweep-deferred"),
    rate_limits=[RateLimit(key="tenant:{tenant}", requests=1, period=8.0)],
)


# -- faults: fan-out conversations under kill -9, and a step that always fails --

#: Every call of the "chaos" script appends one line here (the file lives in
#: the worker's CHORUS_STATE_DIR), so a test counts the model calls each step got.
CHAOS_CALLS_FILE = "chaos-model-calls.log"


def _note_model_call(messages: list[dict[str, Any]]) -> None:
    first = next(str(m["content"]) for m in messages if m["role"] == "user")
    steps = sum(1 for m in messages if m["role"] == "assistant")
    path = os.path.join(os.environ.get("CHORUS_STATE_DIR", "."), CHAOS_CALLS_FILE)
    with open(path, "a", encoding="utf-8") as f:  # one short O_APPEND write: atomic
        f.write(f"{first}\t{steps}\n")


# A short timeout: the sweeper leaves a running call alone for its timeout
# (plus the stall timeout), so a call killed with its worker is re-run soon.
@tool(timeout=10.0)
def chaos_work(label: str, seconds: float = 1.0) -> dict[str, Any]:
    """Sleep, then report (a parallel tool).

    Args:
        label: a name for this call.
        seconds: how long to sleep.
    """
    return _slept(label, seconds)


@tool(parallelizable=False, timeout=10.0)
def chaos_barrier(label: str, seconds: float = 0.5) -> dict[str, Any]:
    """Sleep alone, then report (a barrier).

    Args:
        label: a name for this call.
        seconds: how long to sleep.
    """
    return _slept(label, seconds)


def _chaos(messages: list[dict[str, Any]]) -> Reply:
    """Each turn: 3 parallel tools and a barrier, then an answer naming the input."""
    _note_model_call(messages)
    said = [str(m["content"]) for m in messages if m["role"] == "user"][-1]
    if messages[-1]["role"] == "tool":
        return Reply.say(f"done: {said}")
    seconds = float(os.environ.get("CHORUS_TEST_CHAOS_TOOL_SECONDS", "1.0"))
    return Reply.call(
        *(call("chaos_work", label=f"{said}/p{i}", seconds=seconds) for i in range(3)),
        call("chaos_barrier", label=f"{said}/b", seconds=seconds / 2),
    )


register_script("chaos", [_chaos] * 400)
Agent("chaos", scripted_model("chaos"), tools=[chaos_work, chaos_barrier])


@context_transformer("always_fails")
def _always_fails(history: list[Message], ctx: TransformContext) -> list[Message]:
    """A transformer with a bug: every step that uses it raises."""
    raise RuntimeError("always_fails: a deterministic bug in a context transformer")


register_script("never-reached", [Reply.say("unreachable")] * 3)


# --- db helper ---
# A turn of N steps (``steps=N`` in the input), each calling a no-op tool 4
# times in parallel, then an answer: the shape whose Postgres work per step
# tests/integration/test_step_queries.py counts.


@tool
def db_noop(i: int) -> int:
    """Do nothing and return the argument.

    Args:
        i: any integer.
    """
    return i


def _four_tools(messages: list[dict[str, Any]]) -> Reply:
    said = next(str(m["content"]) for m in messages if m["role"] == "user")
    asked = int(said.removeprefix("steps="))
    done = sum(1 for m in messages if m["role"] == "assistant")
    if done < asked:
        return Reply.call(*(call("db_noop", i=k) for k in range(4)))
    return Reply.say(f"done after {done} steps")


register_script("four-tools", [_four_tools] * 40)
Agent("four-tools", scripted_model("four-tools"), tools=[db_noop], max_steps=40)


# --- fleet helper ---


@tool(timeout=60.0)
def fleet_sleep(label: str, seconds: float) -> dict[str, Any]:
    """Wait on nothing, like a tool waiting on I/O.

    Args:
        label: a name for this call.
        seconds: how long to wait.
    """
    time.sleep(seconds)
    return {"label": label, "pid": os.getpid()}


def _fleet_batch(messages: list[dict[str, Any]]) -> Reply:
    """The input "N SECONDS": N parallel fleet_sleep calls, then an answer."""
    count, seconds = str(next(m["content"] for m in messages if m["role"] == "user")).split()
    if messages[-1]["role"] == "tool":
        return Reply.say(f"slept {count}")
    return Reply.call(
        *(call("fleet_sleep", label=f"s{i}", seconds=float(seconds)) for i in range(int(count)))
    )


register_script("fleet-batch", [_fleet_batch] * 200)
Agent("fleet-batch", scripted_model("fleet-batch"), tools=[fleet_sleep])


@tool
def collector_state() -> dict[str, Any]:
    """Whether this tool's worker process collects garbage (and how much of
    its heap is frozen out of the collections)."""
    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}


def _collector_report(messages: list[dict[str, Any]]) -> Reply:
    """The tools process's collector state, then the model process's own."""
    if messages[-1]["role"] != "tool":
        return Reply.call(call("collector_state"))
    model = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
    return Reply.say(json.dumps({"tools": tool_results(messages)[-1], "model": model}))


register_script("collector-probe", [_collector_report] * 2)
Agent("collector-probe", scripted_model("collector-probe"), tools=[collector_state])


# --- planning and handoffs ---

from orchestrator.llm.scripted import offered_tools  # noqa: E402


def offered_names() -> list[str]:
    """The names of the tools offered with the call being answered."""
    return [t["function"]["name"] for t in offered_tools()]


#: Later items of the keeps-plan plan, long enough to pass an event's preview.
LONG_TODOS = [(i, f"Step {i}: " + "x" * 440, "not-started") for i in range(3, 11)]


def todos(*items: tuple[int, str, str]) -> dict[str, Any]:
    """manage_todo_list arguments: (id, title, status) per item."""
    return {"todos": [{"id": i, "title": t, "status": s} for i, t, s in items]}


def _offered_plan_tool(messages: list[dict[str, Any]]) -> Reply:
    tools = offered_names()
    if "manage_todo_list" not in tools:
        return Reply.say(f"manage_todo_list was not offered: {tools}")
    return Reply.call(
        call(
            "manage_todo_list",
            **todos((1, "Check the weather", "in-progress"), (2, "Book", "not-started")),
        ),
        call("add", a=1, b=2),
    )


register_script(
    "keeps-plan",
    [
        _offered_plan_tool,
        # two items in progress: refused, and the model is told why
        Reply.call(
            call(
                "manage_todo_list",
                **todos((1, "Check the weather", "in-progress"), (2, "Book", "in-progress")),
            )
        ),
        Reply.call(
            call(
                "manage_todo_list",
                **todos(
                    (1, "Check the weather", "completed"),
                    (2, "Book", "in-progress"),
                    *LONG_TODOS,  # a plan of over 2,000 characters: events carry it whole
                ),
            )
        ),
        echo_results,
    ],
)
Agent("keeps-plan", scripted_model("keeps-plan"), tools=["add"], planning=True)
# An agent without planning: the tool is neither offered nor run.
register_script(
    "plans-unasked",
    [Reply.call(call("manage_todo_list", **todos((1, "x", "in-progress")))), echo_results],
)
Agent("plans-unasked", scripted_model("plans-unasked"), tools=["add"])


@tool
def ho_refund(order: str) -> str:
    """Refund an order.

    Args:
        order: the order number.
    """
    return f"order {order} refunded"


@tool
def ho_lookup(order: str) -> dict[str, Any]:
    """Look an order up.

    Args:
        order: the order number.
    """
    return {"order": order, "paid": 30}


def _billing_acts(messages: list[dict[str, Any]]) -> Reply:
    """Billing's first reply after the switch: refund, if its own tools (and
    only those: not triage's, not the handoff) are offered."""
    tools = offered_names()
    if tools != ["ho_refund"]:
        return Reply.say(f"offered {tools}, not billing's tools")
    return Reply.call(call("ho_refund", order="42"))


register_script(
    "ho-triage",
    [
        # the lookup runs under triage; the handoff takes effect after the step
        Reply.call(
            call("ho_lookup", order="42"),
            call("handoff__ho-billing", message="wants a refund of order 42"),
        ),
    ],
)
register_script(
    "ho-billing",
    [
        Reply.say("billing here"),  # billing submitted on its own
        _billing_acts,
        lambda ms: Reply.say(f"billing: {tool_results(ms)[-1]}; tools {tool_names(ms)}"),
        Reply.say("billing again: you are welcome"),  # the next turn stays with billing
    ],
)
register_script(
    "ho-rogue",
    [
        Reply.call(call("handoff__ho-sales", message="sell them something")),
        echo_results,
    ],
)
Agent("ho-sales", scripted_model("ho-billing"), system="You sell.")
Agent("ho-billing", scripted_model("ho-billing"), "You handle refunds.", tools=[ho_refund])
Agent("ho-triage", scripted_model("ho-triage"), tools=[ho_lookup], handoffs=["ho-billing"])
Agent("ho-rogue", scripted_model("ho-rogue"), handoffs=["ho-billing"])


def tool_names(messages: list[dict[str, Any]]) -> list[str]:
    """The tools the model called in the conversation so far, in order."""
    return [
        c["function"]["name"]
        for m in messages
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
    ]


# --- schema: tools from JSON schemas, namespaces, the catalog replay ---
# Two made-up catalogs in the shape of tau-bench airline and BFCL
# (tests/catalogs/*.json), both defining list_all_airports; the cases of
# tests/integration/test_tool_catalogs.py replay calls with the arguments of
# tests/catalogs/cases.json. Every call appends one JSON line to
# CATALOG_CALLS_FILE in the worker's CHORUS_STATE_DIR.


from orchestrator import tool_catalog  # noqa: E402

CATALOG_DIR = Path(__file__).resolve().parent / "catalogs"
CATALOG_CALLS_FILE = "catalog-calls.jsonl"
CATALOGS = [json.loads((CATALOG_DIR / f).read_text()) for f in ("travel.json", "atlas.json")]
CATALOG_CASE_DATA = json.loads((CATALOG_DIR / "cases.json").read_text())
#: Declared definitions by qualified name, in declaration order.
CATALOG_DEFINITIONS = {f"{c['namespace']}.{f['name']}": f for c in CATALOGS for f in c["functions"]}


def _recorder(qualified: str) -> Any:
    def handle(arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        line = {
            "conversation_id": ctx.conversation_id,
            "tool_request_id": ctx.tool_request_id,
            "tool": qualified,
            "arguments": arguments,
        }
        path = os.path.join(os.environ.get("CHORUS_STATE_DIR", "."), CATALOG_CALLS_FILE)
        with open(path, "a", encoding="utf-8") as f:  # one O_APPEND write per call
            f.write(json.dumps(line) + "\n")
        return {"tool": qualified, "received": arguments}

    return handle


CATALOG_TOOLS = [
    t
    for c in CATALOGS
    for t in tool_catalog(
        c["namespace"],
        c["functions"],
        {f["name"]: _recorder(f"{c['namespace']}.{f['name']}") for f in c["functions"]},
        arguments="dict",
        parallelizable=[f["name"] for f in c["functions"] if f["name"] not in c["barriers"]],
        timeout=30.0,
    )
]


def _offered_as(qualified: str) -> str:
    """The name the model was offered the tool under, found as a model
    would: by its description and parameters, never by its name."""
    declared = CATALOG_DEFINITIONS[qualified]
    found = [
        t["function"]["name"]
        for t in offered_tools()
        if t["function"]["description"] == declared["description"]
        and t["function"]["parameters"] == declared["parameters"]
    ]
    if len(found) != 1:
        raise RuntimeError(f"{qualified} offered {len(found)} times")
    return found[0]


def _catalog_step(calls: list[list[Any]]) -> Any:
    def reply(messages: list[dict[str, Any]]) -> Reply:
        return Reply.call(*(ScriptedToolCall(_offered_as(q), args) for q, args in calls))

    return reply


def _catalog_answer(messages: list[dict[str, Any]]) -> Reply:
    """Each turn ends with the tools the model was offered, as JSON."""
    return Reply.say(json.dumps(offered_tools()))


def _catalog_cases() -> dict[str, list[list[list[list[Any]]]]]:
    """Case name → turns → steps → calls ``[qualified tool, arguments]``."""
    examples: dict[str, list[dict[str, Any]]] = CATALOG_CASE_DATA["examples"]
    every = [[q, a] for q, found in examples.items() for a in found]
    barriers = {f"{c['namespace']}.{b}" for c in CATALOGS for b in c["barriers"]}
    parallel = [c for c in every if c[0] not in barriers]
    cases: dict[str, list[list[list[list[Any]]]]] = {}
    for q, found in examples.items():  # one call with each example's arguments
        for n, arguments in enumerate(found):
            cases[f"single{n}-{q}"] = [[[[q, arguments]]]]
    for i in range(0, len(parallel), 5):  # parallel calls: one step, one segment
        cases[f"parallel-{i // 5}"] = [[parallel[i : i + 5]]]
    for i in range(3):  # multi-turn: three user turns of two steps
        turns = [every[(i * 6 + t * 2) % len(every) :][:2] for t in range(3)]
        cases[f"multi-turn-{i}"] = [[[a], [b]] for a, b in turns]
    cases["sequential-30"] = [[[every[s % len(every)]] for s in range(30)]]
    for i, v in enumerate(CATALOG_CASE_DATA["violations"]):
        cases[f"violation-{i}"] = [[[[v["tool"], v["arguments"]]]]]
    return cases


CATALOG_CASES = _catalog_cases()
for _case, _turns in CATALOG_CASES.items():
    _name = f"catalog-{_case}".replace(".", "-")[:60]
    register_script(
        _name, [r for steps in _turns for r in [*map(_catalog_step, steps), _catalog_answer]]
    )
    Agent(_name, scripted_model(_name), tools=CATALOG_TOOLS, max_steps=40)


# --- large tool outputs ---
# ``big-reader``: its input is a JSON list of calls ({"tool", "params"}) the
# model makes at once; then it answers with the JSON list of the tool
# messages it was shown for them, so a test sees exactly what the model saw.


def big_text(size: int) -> str:
    """``size`` characters that say where they are: ``<0000000><0000001>…``."""
    return "".join(f"<{i:07d}>" for i in range(size // 9 + 1))[:size]


@tool
def big_output(size: int, as_json: bool = False) -> Any:
    """A long output: ``size`` characters of text, or JSON rows when ``as_json``.

    Args:
        size: characters of text (rows: size // 40).
        as_json: return a list of objects instead of a string.
    """
    if as_json:
        return [{"row": i, "name": f"item-{i}", "note": "déjà vu"} for i in range(size // 40)]
    return big_text(size)


def _big_reader(messages: list[dict[str, Any]]) -> Reply:
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    shown = [m["content"] for m in messages[last_user:] if m["role"] == "tool"]
    if shown:
        return Reply.say(json.dumps(shown))
    calls = json.loads(str(messages[last_user]["content"]))
    return Reply.call(*(call(c["tool"], **c["params"]) for c in calls))


register_script("big-reader", [_big_reader] * 40)
# it lists read_tool_output: offered on every step, even in a conversation
# that holds no cut output (where another tree's handle is refused)
Agent(
    "big-reader",
    scripted_model("big-reader"),
    tools=[big_output, "read_tool_output"],
    tool_output_limit=10_000,
)


# --- multi-agent pipeline ---
# The example's planner, implementer and critic (tests/integration/test_pipeline.py).
__import__("examples.pipeline")


# --- parallelism caps and priorities ---

_lanes_lock = threading.Lock()
_lanes_running = 0


@tool(queue="lanes")
def lane(label: str, seconds: float = 0.8) -> dict[str, Any]:
    """Wait, and report how many lane calls of this process ran at once.

    Args:
        label: a name for this call.
        seconds: how long to wait.
    """
    global _lanes_running
    with _lanes_lock:
        _lanes_running += 1
        running = _lanes_running
    try:
        return {**_slept(label, seconds), "running": running}
    finally:
        with _lanes_lock:
            _lanes_running -= 1


LANES = 12
register_script(
    "lanes",
    [Reply.call(*(call("lane", label=f"l{i}") for i in range(LANES))), echo_results],
)
Agent("capped-lanes", scripted_model("lanes"), tools=[lane], max_parallel_tools=4)
Agent("open-lanes", scripted_model("lanes"), tools=[lane])


def gate_path(state_dir: str | Path, name: str) -> Path:
    """A file in the fleet's state directory the test and the workers both see."""
    return Path(state_dir) / f"gate-{name}"


def _at_gate(gate: str) -> None:
    """Mark GATE started, then wait until the test opens it (its file exists)."""
    state_dir = os.environ["CHORUS_STATE_DIR"]
    gate_path(state_dir, f"{gate}-started").touch()
    deadline = time.monotonic() + 60
    while not gate_path(state_dir, gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _gated(messages: list[dict[str, Any]]) -> Reply:
    """The input "GATE LABEL": wait at GATE, then answer LABEL."""
    gate, label = str(messages[-1]["content"]).split()
    _at_gate(gate)
    return Reply.say(f"done {label}")


register_script("gated", [_gated])
Agent("gated", scripted_model("gated"))


# -- a tool-call budget spent by children at once: the input "GATE" starts
# two children, each waiting at GATE-a or GATE-b, then calling add once


def _add_at_gate(messages: list[dict[str, Any]]) -> Reply:
    _at_gate(str(messages[-1]["content"]))
    return Reply.call(call("add", a=1, b=1))


register_script("gated-adder", [_add_at_gate, echo_results])
Agent("gated-adder", scripted_model("gated-adder"), tools=[add])
register_script(
    "adder-lead",
    [
        lambda ms: Reply.call(
            *(call("subagent__gated-adder", task=f"{ms[-1]['content']}-{c}") for c in "ab")
        ),
        echo_results,
    ],
)
Agent("adder-lead", scripted_model("adder-lead"), subagents=["gated-adder"])


#: Set in a worker's environment: each task it runs is recorded with the
#: broker priority it was delivered with, in the list ``<prefix>:priorities``.
RECORD_PRIORITIES = "CHORUS_TEST_RECORD_PRIORITIES"

if os.environ.get(RECORD_PRIORITIES):
    from celery.signals import task_prerun

    @task_prerun.connect(weak=False)
    def _record_priority(task_id: str, task: Any, **_: Any) -> None:
        import redis

        priority = (task.request.delivery_info or {}).get("priority")
        store = redis.Redis.from_url(os.environ["CHORUS_REDIS_URL"])
        store.rpush(
            f"{os.environ['CHORUS_REDIS_PREFIX']}:priorities",
            json.dumps({"task": task.name, "id": task_id, "priority": priority}),
        )
        store.close()


# --- MCP toolsets ---

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from orchestrator import MCPServer  # noqa: E402

#: The test MCP server (tests/mcp_server.py) run over stdio, from the repository root.
mcp_stdio = MCPServer(
    "mcp_stdio",
    command=[sys.executable, "-m", "tests.mcp_server", "stdio"],
    cwd=str(Path(__file__).resolve().parent.parent),
    timeout=3.0,
)
#: The same server over streamable HTTP, started by the test that sets the URL;
#: its calls run on a queue of their own.
mcp_http = MCPServer(
    "mcp_http",
    url=os.environ.get("CHORUS_TEST_MCP_URL", "http://127.0.0.1:1/mcp"),
    queue="mcp",
    timeout=3.0,
)
#: A server nobody runs: nothing listens on port 1.
mcp_down = MCPServer("mcp_down", url="http://127.0.0.1:1/mcp", timeout=3.0)


def _mcp_results(messages: list[dict[str, Any]]) -> Reply:
    """The tool results, one per line, as the answer."""
    return Reply.say("\n".join(str(m["content"]) for m in messages if m["role"] == "tool"))


register_script(
    "mcp-stdio",
    [
        Reply.call(
            call("mcp_stdio__echo", text="hello"),
            call("mcp_stdio__fail", reason="boom"),
            call("mcp_stdio__slow", seconds=30),
            call("mcp_http.echo", text="not mine"),
        ),
        _mcp_results,
    ],
)
Agent("mcp-stdio", scripted_model("mcp-stdio"), tools=[mcp_stdio])

register_script(
    "mcp-down",
    [
        # the qualified name, as a model that saw the tool earlier would call
        # it: a server that is down at discovery offers nothing now, so the
        # step refuses it
        Reply.call(
            call("mcp_down.echo", text="anyone?"),
            call("add", a=1, b=2),
            call("mcp_down.no such tool"),  # not a legal tool name
        ),
        _mcp_results,
    ],
)
Agent("mcp-down", scripted_model("mcp-down"), tools=[mcp_down, "add"])

# -- sweeper: a tool on a queue no worker reads; a model call that takes a while --


@tool(queue="nobody-reads")
def unread_tool() -> str:
    """A tool routed to a queue that no test worker consumes."""
    return "never runs"


register_script("unread-queue", [Reply.call(call("unread_tool")), echo_results])
Agent("unread-queue", scripted_model("unread-queue"), tools=[unread_tool])


def _long_answer(messages: list[dict[str, Any]]) -> Reply:
    # The input: seconds to take (waited on an event: Python's time.sleep
    # fails under libfaketime, which a test uses to skew a worker's clock)
    threading.Event().wait(float(messages[-1]["content"]))
    return Reply.say("took my time")


register_script("long-call", [_long_answer])
Agent("long-call", scripted_model("long-call"))

#: Inputs whose first model call failed (in this worker process).
_failed_once: set[str] = set()


def _fail_once(messages: list[dict[str, Any]]) -> Reply:
    text = str(messages[-1]["content"])
    if text not in _failed_once:
        _failed_once.add(text)
        from litellm.llms.custom_llm import CustomLLMError  # where a model is called

        raise CustomLLMError(status_code=503, message="overloaded, try later")
    return Reply.say("recovered")


register_script("retry-later", [_fail_once])
Agent(
    "retry-later",
    scripted_model("retry-later"),
    retry=RetryPolicy(initial_delay=10.0, jitter=0.0, max_attempts=3),
)


# --- Policies (tests/integration/test_policies.py) ---------------------------

from orchestrator.errors import ModelError  # noqa: E402
from orchestrator.llm.reply import ModelReply  # noqa: E402
from orchestrator.policies import Defer, ModelCall, Policy, Stop, ToolCall, register_policy  # noqa: E402
from orchestrator.policies import policy as declare_policy  # noqa: E402
from tests.readme import FallbackAfter5xx  # noqa: E402

#: The README's fallback policy, falling back to a second loopback model.
LOOPBACK_FALLBACK = "openai/loopback-fallback"
register_policy("fallback-loopback", FallbackAfter5xx(fallback=LOOPBACK_FALLBACK))
POLICY_BOOM = "policy boom 7f3a"


@declare_policy("explode")
def explode(call: ModelCall) -> ModelCall:
    """A policy with a bug: it raises on every call."""
    raise RuntimeError(POLICY_BOOM)


@declare_policy("hold-while-file")
def hold_while_file(call: ModelCall) -> ModelCall | Defer:
    """Defers the call for half a second while the file named by the job's
    ``context_data["hold"]`` exists (durable state outside the process)."""
    held = call.context_data.get("hold")
    return Defer(0.5, "held") if held and Path(held).exists() else call


@declare_policy("hold-tools-while-file")
class HoldToolsWhileFile(Policy):
    """Defers every tool call for 0.3 s while the file named by the job's
    ``context_data["hold"]`` exists; marks ``<file>.deferred`` when it does."""

    def before_tool(self, call: ToolCall) -> ToolCall | Defer:
        held = call.context_data.get("hold")
        if not (held and Path(held).exists()):
            return call
        Path(f"{held}.deferred").touch()
        return Defer(0.3, "held")


@declare_policy("guard-add")
class GuardAdd(Policy):
    """Refuses ``add`` with ``a`` over 100; caps ``b`` at 10 (a rewrite)."""

    def before_tool(self, call: ToolCall) -> ToolCall | Stop:
        if call.tool != "add":
            return call
        if call.params.get("a", 0) > 100:
            return Stop("sums over 100 need a human")
        return call.rewrite(params={**call.params, "b": min(call.params.get("b", 0), 10)})


@declare_policy("log-replies")
class LogReplies(Policy):
    """Appends each reply's model and text to the file named by the job's
    ``context_data["log"]`` (an observer)."""

    def after_model(self, call: ModelCall, reply: ModelReply) -> None:
        with Path(call.context_data["log"]).open("a") as log:
            log.write(f"{call.model} attempt {call.attempt}: {reply.text}\n")


@declare_policy("no-retry-on-5xx")
class NoRetryOn5xx(Policy):
    """Fails the turn at the first 5xx instead of retrying."""

    def on_model_failure(self, call: ModelCall, error: ModelError) -> Stop | None:
        return Stop(f"{call.model} is down") if (error.status or 0) >= 500 else None


# -- tracing: a tool batch (two parallel tools and a subagent), then an answer --

register_script(
    "traced-lead",
    [
        Reply.call(
            call("add", a=1, b=2),
            call("add", a=3, b=4),
            call("subagent__echo-child", task="trace me"),
        ),
        echo_results,
    ],
)
Agent("traced-lead", scripted_model("traced-lead"), tools=[add], subagents=["echo-child"])


# -- the dashboard's browser tests: three parallel tools (p3 the straggler), a
# call that runs alone, and a subagent with a subagent of its own -------------

register_script(
    "dash-lead",
    [
        Reply.call(
            call("timed", label="p1", seconds=0.2),
            call("timed", label="p2", seconds=0.3),
            call("timed", label="p3", seconds=0.9),
            call("timed_barrier", label="b", seconds=0.2),
            call("subagent__deep-researcher", task="gamma"),
        ),
        echo_results,
    ],
)
Agent(
    "dash-lead",
    scripted_model("dash-lead"),
    tools=[timed, timed_barrier],
    subagents=["deep-researcher"],
)

register_script(  # followed live across a server restart: its tools outlast one
    "dash-slow",
    [
        Reply.call(*(call("timed", label=f"s{i}", seconds=10.0) for i in range(3))),
        echo_results,
    ],
)
Agent("dash-slow", scripted_model("dash-slow"), tools=[timed])

register_script(  # followed live while its stream drops and its redraws fail
    "dash-brief",
    [
        Reply.call(*(call("timed", label=f"b{i}", seconds=3.0) for i in range(2))),
        echo_results,
    ],
)
Agent("dash-brief", scripted_model("dash-brief"), tools=[timed])


from tests import approval_agents  # noqa: E402, F401  (the approval tests' tools and agents)
