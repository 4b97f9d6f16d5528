"""Server-Sent Events: ``id`` is the event's seq (live-only deltas have
none, so a reconnect's ``Last-Event-ID`` is the last stored event), ``event``
its name, ``data`` its JSON; a comment line while nothing happens keeps
proxies from closing the stream; ``event: end`` closes it (``event: error``
first when reading failed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from orchestrator.errors import ChorusError, ServiceUnavailableError
from orchestrator.server.errors import body
from schemas import Event

log = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"

#: The OpenAPI description of an event stream.
STREAM_RESPONSE = {
    "description": (
        "A Server-Sent Events stream: one `id: <seq>` / `event: <name>` / "
        "`data: <Event JSON>` block per event (deltas have no id), `: keep-alive` "
        "comments while idle, an `event: error` with the error body if reading "
        "failed, and a final `event: end`. Reconnect with `Last-Event-ID` (or "
        "`?last_event_id=`) to get exactly the events after it."
    ),
    "content": {MEDIA_TYPE: {"schema": {"type": "string"}}},
}


#: The arguments of an event stream's route.
ROUTE: dict[str, Any] = {
    "response_class": StreamingResponse,
    "responses": {200: STREAM_RESPONSE},
}


def frame(event: Event) -> str:
    head = f"id: {event.seq}\n" if event.seq is not None else ""
    return f"{head}event: {event.name.value}\ndata: {event.model_dump_json()}\n\n"


async def _frames(events: AsyncIterator[Event], keepalive: float) -> AsyncIterator[str]:
    pending: asyncio.Task[Event] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending}, timeout=keepalive)
            if not done:
                yield ": keep-alive\n\n"
                continue
            task, pending = pending, None
            try:
                yield frame(task.result())
            except StopAsyncIteration:
                break
    except ChorusError as exc:
        yield f"event: error\ndata: {json.dumps(body(exc))}\n\n"
    except Exception as exc:  # Postgres or Redis went away mid-stream, or a bug: logged
        log.warning("an event stream failed", exc_info=exc)
        error = ServiceUnavailableError(f"reading events failed: {type(exc).__name__}")
        yield f"event: error\ndata: {json.dumps(body(error))}\n\n"
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await events.aclose()  # type: ignore[attr-defined]
    yield "event: end\ndata: {}\n\n"


def stream(events: AsyncIterator[Event], keepalive: float) -> StreamingResponse:
    return StreamingResponse(
        _frames(events, keepalive),
        media_type=MEDIA_TYPE,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
