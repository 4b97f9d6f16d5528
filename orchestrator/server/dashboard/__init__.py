"""The dashboard: server-rendered pages of jobs, trees, timelines and cost
at ``/dashboard``, a client of the HTTP API (see ``api.py``)."""

from __future__ import annotations

from fastapi import FastAPI

from orchestrator.server.dashboard.cookie import CookieBearer
from orchestrator.server.dashboard.routes import router


def mount(app: FastAPI) -> None:
    """Serve the dashboard from ``app`` (the HTTP API's application)."""
    app.include_router(router)
    app.add_middleware(CookieBearer)


__all__ = ["mount"]
