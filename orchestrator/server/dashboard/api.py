"""The dashboard is a client of the HTTP API, like any other: its pages ask
``/v1`` in-process (over ASGI, no socket) with the visitor's token as a
bearer token, so the API's auth, scopes and tenants decide what a page
shows; the browser's own calls (live events, cancel, send) go to ``/v1``
directly with the token's cookie (:mod:`orchestrator.server.dashboard.cookie`)."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import Request

from orchestrator.server.dashboard.cookie import COOKIE

#: Events asked for per page when a job page loads its history.
EVENTS_PAGE = 5000


class ApiError(Exception):
    """The API answered an error: its status and ``{type, message}`` body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('message', '')}")
        self.status = status
        self.body = body


def token_of(request: Request) -> str | None:
    return request.cookies.get(COOKIE)


class Api:
    """The API as the visitor's token sees it."""

    def __init__(self, request: Request, token: str) -> None:
        transport = httpx.ASGITransport(app=request.app)
        self._http = httpx.AsyncClient(
            transport=transport,
            base_url="http://chorus.internal",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def get(self, path: str, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v not in (None, "")}
        answer = await self._http.get(path, params=query)
        if answer.status_code >= 400:
            body = (
                answer.json()
                if answer.headers.get("content-type", "").startswith("application/json")
                else {"message": answer.text}
            )
            raise ApiError(answer.status_code, body)
        return answer.json()

    async def events(self, job_id: str, **filters: Any) -> list[dict[str, Any]]:
        """Every stored event of the job that passes ``filters`` (see
        ``GET /v1/runs/{job_id}/events``), a page at a time."""
        found: list[dict[str, Any]] = []
        after: int | None = 0
        while after is not None:
            page = await self.get(
                f"/v1/runs/{job_id}/events", after=after, limit=EVENTS_PAGE, **filters
            )
            found += page["events"]
            after = page["next_after"]
        return found
