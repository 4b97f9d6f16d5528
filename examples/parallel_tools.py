"""A trip-planning agent: three parallel lookups, one barrier, one answer.

The scripted model (reached through litellm like any provider) first asks
for three parallelizable lookups and one non-parallelizable booking; the
engine runs the lookups as a chord and the booking as a chain barrier after
them. On its second step the model answers from every tool result.

Run it with ``chorus local``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from orchestrator import Agent, ToolContext, tool
from orchestrator.llm.scripted import Reply, call, register_script, scripted_model

CITY = "Lisbon"


@tool
def weather(city: str) -> dict[str, Any]:
    """Today's weather in a city.

    Args:
        city: the city name.
    """
    time.sleep(0.2)
    return {"city": city, "forecast": "sunny", "high_c": 24}


@tool
def flights(city: str, max_price_eur: int = 300) -> dict[str, Any]:
    """Cheapest flight to a city under a price.

    Args:
        city: where to fly.
        max_price_eur: the most to pay.
    """
    time.sleep(0.2)
    return {"city": city, "carrier": "TP", "price_eur": min(189, max_price_eur)}


@tool
def hotels(city: str, nights: int) -> dict[str, Any]:
    """The best-rated hotel with rooms free.

    Args:
        city: where to stay.
        nights: how many nights.
    """
    time.sleep(0.2)
    return {"city": city, "hotel": "Casa do Rio", "nights": nights, "per_night_eur": 120}


@tool(parallelizable=False)
def book_trip(city: str, ctx: ToolContext) -> dict[str, Any]:
    """Book the trip; runs alone, after the lookups.

    Args:
        city: the destination.
    """
    return {"city": city, "booking_ref": f"BK-{ctx.tool_request_id[-6:].upper()}"}


def _results(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Tool results the model was shown, by tool call id order."""
    out: dict[str, Any] = {}
    for m in messages:
        if m.get("role") == "tool":
            content = m["content"]
            value = json.loads(content) if content.startswith("{") else content
            out[m.get("name") or m["tool_call_id"]] = value
    return out


def _answer(messages: list[dict[str, Any]]) -> Reply:
    found = list(_results(messages).values())
    weather_, flight, hotel, booking = found[-4:]
    return Reply.say(
        f"Your trip to {weather_['city']}: {weather_['forecast']}, high of "
        f"{weather_['high_c']}°C. Flight with {flight['carrier']} at {flight['price_eur']} EUR; "
        f"{hotel['nights']} nights at {hotel['hotel']} ({hotel['per_night_eur']} EUR/night). "
        f"Booked: {booking['booking_ref']}."
    )


register_script(
    "trip-planner",
    [
        Reply.call(
            call("weather", city=CITY),
            call("flights", city=CITY, max_price_eur=250),
            call("hotels", city=CITY, nights=3),
            call("book_trip", city=CITY),
            text="Let me check weather, flights and hotels, then book.",
        ),
        _answer,
    ],
)

trip_planner = Agent(
    "trip-planner",
    model=scripted_model("trip-planner"),
    system="You plan trips. Look things up in parallel, then book.",
    tools=[weather, flights, hotels, book_trip],
)
