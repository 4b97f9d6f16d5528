"""A cap on request bodies, before anything reads them.

No request of the API needs more than a job's input (200,000 characters by
default, up to 6 bytes each once escaped in JSON) and its context data
(256,000 bytes), so a body larger than :data:`MAX_BODY_BYTES` is refused
with 413: by its ``Content-Length`` at once, or, sent in chunks without
one, as soon as the chunks read pass the cap. uvicorn pauses reading the
socket while the application has not taken a chunk, so the server never
holds more than the cap and a chunk of a body. A body must also arrive
whole within :data:`BODY_SECONDS` of the request's start (408 past it): one
sent a byte at a time, or never ended, held its connection for good.
"""

from __future__ import annotations

import asyncio

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Largest request body accepted, in bytes.
MAX_BODY_BYTES = 2 * 1024 * 1024
#: Seconds a request's body has to arrive whole in (2 MiB at 300 kbit/s).
BODY_SECONDS = 60.0


class BodyLimit:
    """ASGI middleware refusing request bodies over ``limit`` bytes (413)
    or not whole within ``within`` seconds (408)."""

    def __init__(
        self, app: ASGIApp, limit: int = MAX_BODY_BYTES, within: float = BODY_SECONDS
    ) -> None:
        self.app = app
        self.limit = limit
        self.within = within

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await _refused(self.limit)(scope, receive, send)
            return
        seen, whole = 0, False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.within

        async def counted() -> Message:
            nonlocal seen, whole
            if whole:  # the body is read: a wait for the client's disconnect
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:  # FastAPI passes an HTTPException on as it is
                raise HTTPException(408, _late(self.within)) from None
            if message["type"] != "http.request":
                whole = True
                return message
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise HTTPException(413, _message(self.limit))
            whole = not message.get("more_body", False)
            return message

        await self.app(scope, counted, send)


def _message(limit: int) -> str:
    return f"the request body is larger than {limit} bytes"


def _late(within: float) -> str:
    return f"the request body did not arrive whole within {within:g} s"


def _refused(limit: int) -> JSONResponse:
    body = {"type": "HTTPError", "message": _message(limit), "fields": []}
    return JSONResponse(body, status_code=413)
