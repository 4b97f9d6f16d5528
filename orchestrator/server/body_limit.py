"""A cap on request bodies, before anything reads them.

No request of the API needs more than a job's input (200,000 characters by
default, up to 6 bytes each once escaped in JSON) and its context data
(256,000 bytes), so a body larger than :data:`MAX_BODY_BYTES` is refused
with 413: by its ``Content-Length`` at once, or, sent in chunks without
one, as soon as the chunks read pass the cap. uvicorn pauses reading the
socket while the application has not taken a chunk, so the server never
holds more than the cap and a chunk of a body.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Largest request body accepted, in bytes.
MAX_BODY_BYTES = 2 * 1024 * 1024


class BodyLimit:
    """ASGI middleware refusing request bodies over ``limit`` bytes (413)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await _refused(self.limit)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # FastAPI passes an HTTPException on as it is
                    raise HTTPException(413, _message(self.limit))
            return message

        await self.app(scope, counted, send)


def _message(limit: int) -> str:
    return f"the request body is larger than {limit} bytes"


def _refused(limit: int) -> JSONResponse:
    body = {"type": "HTTPError", "message": _message(limit), "fields": []}
    return JSONResponse(body, status_code=413)
