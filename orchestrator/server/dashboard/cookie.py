"""The dashboard's session: the API token in an http-only, ``SameSite=Strict``
cookie (never in a URL), presented to ``/v1`` as a bearer token.

The browser cannot put a header on an ``EventSource``, so requests to
``/v1`` that carry the cookie and no ``Authorization`` header get it from
the cookie. ``SameSite=Strict`` keeps other sites' pages from sending the
cookie at all; a state-changing request authenticated by the cookie must
also carry ``X-Chorus-Dashboard: 1``, a header no cross-site form can set.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "chorus_token"
CSRF_HEADER = b"x-chorus-dashboard"
_SAFE = {"GET", "HEAD", "OPTIONS"}


def _cookie(headers: list[tuple[bytes, bytes]]) -> str | None:
    for key, value in headers:
        if key != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            name, _, token = part.strip().partition("=")
            if name == COOKIE and token:
                return token
    return None


class CookieBearer:
    """ASGI middleware: the cookie's token as ``Authorization`` on ``/v1``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope["path"]).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope["headers"])
        token = _cookie(headers)
        if token is None or any(key == b"authorization" for key, _ in headers):
            await self.app(scope, receive, send)
            return
        if scope["method"] not in _SAFE and not any(key == CSRF_HEADER for key, _ in headers):
            await _forbidden(send)
            return
        headers.append((b"authorization", f"Bearer {token}".encode("latin-1")))
        await self.app({**scope, "headers": headers}, receive, send)


async def _forbidden(send: Send) -> None:
    body = json.dumps(
        {
            "type": "PermissionDeniedError",
            "message": f"a request authenticated by the dashboard's cookie needs "
            f"the {CSRF_HEADER.decode()} header",
            "fields": [],
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})
