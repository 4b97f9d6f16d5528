"""Tools and agents of the approval tests (imported by tests.agents)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from orchestrator import Agent, Client, Job, ToolContext, schema_tool, tool
from orchestrator.events import row_to_event
from orchestrator.llm.scripted import Reply, call, register_script, scripted_model
from orchestrator.store.tables import EventRow
from schemas import Event, EventName
from tests.agents import echo_results


def stored_events(client: Client, job: Job, *names: EventName) -> list[Event]:
    """The job's tree's events stored so far, in order, those named
    ``names`` when given (``Job.events`` follows until the turn ends)."""
    with client.runtime.session() as s:
        rows = s.exec(
            select(EventRow).where(EventRow.root_id == job.root_id).order_by(col(EventRow.seq))
        ).all()
        events = [row_to_event(row) for row in rows]
    return [e for e in events if not names or e.name in names]


def _mark(ctx: ToolContext, line: str) -> None:
    """Append a line to the file the job's context names: one line a run."""
    mark = ctx.context_data.get("mark")
    if mark:
        with Path(mark).open("a") as f:
            f.write(line + "\n")


@tool(approval=True)
def book_flight(flight: str, ctx: ToolContext) -> str:
    """Book a flight (a person approves every booking).

    Args:
        flight: the flight number.
    """
    _mark(ctx, f"book_flight {flight}")
    return f"booked {flight}"


@tool
def lookup_city(city: str, ctx: ToolContext, seconds: float = 0.2) -> dict[str, Any]:
    """Look a city up.

    Args:
        city: the city.
        seconds: how long it takes.
    """
    time.sleep(seconds)
    _mark(ctx, f"lookup_city {city}")
    return {"city": city, "at": time.time()}


@tool
def issue_refund(amount: int, ctx: ToolContext) -> str:
    """Refund an amount (gated by the agents that list it in ``approve``).

    Args:
        amount: in euros.
    """
    _mark(ctx, f"issue_refund {amount}")
    return f"refunded {amount}"


# lookup_city and book_flight in one parallel segment, then a reply with what came back
register_script(
    "travel-desk",
    [
        Reply.call(
            call("lookup_city", city="Lisbon", seconds=1.0), call("book_flight", flight="LIS-123")
        ),
        echo_results,
    ]
    * 20,
)
Agent("travel-desk", scripted_model("travel-desk"), tools=[lookup_city, book_flight])

# issue_refund is gated by the agent alone, and unanswered calls are denied after 2 s
register_script("refund-desk", [Reply.call(call("issue_refund", amount=40)), echo_results] * 20)
Agent(
    "refund-desk",
    scripted_model("refund-desk"),
    tools=[issue_refund],
    approve=[issue_refund],
    approval_timeout=2.0,
)

#: What a hostile model puts in a gated call's arguments (the dashboard lists them).
HOSTILE_FLIGHT = (
    "</pre><script>window.__xss=1</script>"
    '<img src=x onerror="window.__xss=2"> O\'Brien Zürich & <b>'
)
register_script(
    "hostile-desk", [Reply.call(call("book_flight", flight=HOSTILE_FLIGHT)), echo_results] * 20
)
Agent("hostile-desk", scripted_model("hostile-desk"), tools=[book_flight])


def _cancel_booking(args: dict[str, Any], ctx: ToolContext) -> str:
    _mark(ctx, f"cancel_booking {args['booking']}")
    return f"cancelled {args['booking']}"


#: A JSON-schema tool that needs a person's answer, like book_flight.
cancel_booking = schema_tool(
    "cancel_booking",
    "Cancel a booking (a person approves every cancellation).",
    {
        "type": "object",
        "properties": {"booking": {"type": "string"}},
        "required": ["booking"],
        "additionalProperties": False,
    },
    _cancel_booking,
    arguments="dict",
    approval=True,
)
register_script(
    "cancel-desk", [Reply.call(call("cancel_booking", booking="BK-7")), echo_results] * 20
)
Agent("cancel-desk", scripted_model("cancel-desk"), tools=[cancel_booking])

# book_flight waits beside a subagent whose second step finds a 30-token
# budget spent (every model call here reports 20 tokens): the stop comes
# from the subagent's step while the parent's call waits
register_script(
    "slow-spender",
    [
        Reply(
            tool_calls=[call("lookup_city", city="Porto", seconds=1.5)],
            input_tokens=10,
            output_tokens=10,
        ),
        Reply(text="spent", input_tokens=10, output_tokens=10),
    ],
)
Agent("slow-spender", scripted_model("slow-spender"), tools=[lookup_city])
register_script(
    "guarded-lead",
    [
        Reply(
            tool_calls=[
                call("book_flight", flight="GRD-1"),
                call("subagent__slow-spender", task="spend"),
            ],
            input_tokens=10,
            output_tokens=10,
        ),
        echo_results,
    ],
)
Agent(
    "guarded-lead", scripted_model("guarded-lead"), tools=[book_flight], subagents=["slow-spender"]
)

# a budget spent as it runs: two priced subagents, then a call that waits for a person
register_script(
    "dash-budget",
    [
        Reply.call(*(call("subagent__priced-child", task=f"c{i}") for i in range(2))),
        Reply.call(call("book_flight", flight="BUD-1")),
        echo_results,
    ],
)
Agent("dash-budget", scripted_model("dash-budget"), tools=[book_flight], subagents=["priced-child"])
