"""Server-Sent Events: ``id`` is the event's seq (live-only deltas have
none, so a reconnect's ``Last-Event-ID`` is the last stored event), ``event``
its name, ``data`` its JSON; a comment line while nothing happens keeps
proxies from closing the stream; ``event: end`` closes it (``event: error``
first when reading failed, or when the stream's token was revoked)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from orchestrator.errors import ChorusError, ServiceUnavailableError
from orchestrator.server.errors import body
from orchestrator.server.revocations import RECHECK, Revocations
from orchestrator.store.token_sql import Principal
from schemas import Event

log = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"

#: The OpenAPI description of an event stream.
STREAM_RESPONSE = {
    "description": (
        "A Server-Sent Events stream: one `id: <seq>` / `event: <name>` / "
        "`data: <Event JSON>` block per event (deltas have no id), `: keep-alive` "
        "comments while idle, an `event: error` with the error body if reading "
        "failed or the token was revoked meanwhile (`AuthenticationError`, within "
        f"{RECHECK:g} s), and a final `event: end`. Reconnect with `Last-Event-ID` (or "
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


def _error(exc: ChorusError) -> str:
    return f"event: error\ndata: {json.dumps(body(exc))}\n\n"


async def _frames(
    events: AsyncIterator[Event], keepalive: float, watch: Revocations, token_id: str
) -> AsyncIterator[str]:
    pending: asyncio.Task[Event] | None = None
    try:
        with watch.watching(token_id) as ended:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(anext(events))
                either: set[asyncio.Future[Any]] = {pending, ended}
                done, _ = await asyncio.wait(
                    either, timeout=keepalive, return_when=asyncio.FIRST_COMPLETED
                )
                if ended.done():  # the token was revoked: not one event more
                    yield _error(ended.result())
                    break
                if not done:
                    yield ": keep-alive\n\n"
                    continue
                task, pending = pending, None
                try:
                    yield frame(task.result())
                except StopAsyncIteration:
                    break
    except ChorusError as exc:
        yield _error(exc)
    except Exception as exc:  # Postgres or Redis went away mid-stream, or a bug: logged
        log.warning("an event stream failed", exc_info=exc)
        yield _error(ServiceUnavailableError(f"reading events failed: {type(exc).__name__}"))
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await events.aclose()  # type: ignore[attr-defined]
    yield "event: end\ndata: {}\n\n"


def stream(
    request: Request, principal: Principal, events: AsyncIterator[Event]
) -> StreamingResponse:
    """``events`` as the response to ``request``, for as long as
    ``principal``'s token stays valid (:mod:`orchestrator.server.revocations`)."""
    keepalive, watch = request.app.state.keepalive, request.app.state.revocations
    assert isinstance(watch, Revocations)
    return StreamingResponse(
        _frames(events, keepalive, watch, principal.token_id),
        media_type=MEDIA_TYPE,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
