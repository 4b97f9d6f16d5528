"""The ASGI application: ``create_app(settings)``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from orchestrator.client import Client
from orchestrator.errors import ConfigurationError
from orchestrator.server import approvals, conversations, dashboard, errors, jobs, me, runs
from orchestrator.server.auth import client_of
from orchestrator.server.body_limit import BodyLimit
from orchestrator.server.models import Ready
from orchestrator.server.revocations import RECHECK, Revocations
from orchestrator.settings import Settings

#: Seconds without an event before an SSE stream sends a keep-alive comment.
KEEPALIVE = 15.0


def create_app(settings: Settings, *, keepalive: float = KEEPALIVE) -> FastAPI:
    """The HTTP API over one :class:`Client` of ``settings``' fleet.
    ``keepalive`` must be a positive number of seconds: it also bounds how
    long a result's wait goes without re-checking its token."""
    if not keepalive > 0:  # 0 spins every wait and stream; NaN and negatives too
        raise ConfigurationError(f"keepalive must be a positive number of seconds, not {keepalive}")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = Client(settings)
        app.state.client = client
        app.state.revocations = Revocations(client, every=min(keepalive, RECHECK))
        checks = asyncio.create_task(app.state.revocations.run(), name="chorus-token-checks")
        try:
            yield
        finally:
            checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checks
            client.close()

    app = FastAPI(
        title="Chorus",
        version="1",
        description=(
            "Durable LLM agent runs. Bearer tokens from `chorus token create`; errors are "
            "`{type, message, fields}`; events are Server-Sent Events whose ids are event seqs."
        ),
        lifespan=lifespan,
    )
    app.state.keepalive = keepalive
    app.add_middleware(BodyLimit)
    errors.install(app)
    app.include_router(jobs.router)
    app.include_router(conversations.router)
    app.include_router(approvals.router)
    app.include_router(runs.router)
    app.include_router(me.router)
    dashboard.mount(app)

    @app.get("/v1/health", tags=["probes"])
    def health() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get(
        "/v1/ready",
        tags=["probes"],
        response_model=Ready,
        responses={503: {"model": Ready, "description": "Postgres or Redis is unreachable"}},
    )
    def ready(request: Request) -> JSONResponse:
        """Readiness: Postgres and Redis answer."""
        client = client_of(request)
        state = Ready(postgres=_answers_sql(client), redis=_answers_redis(client))
        ok = state.postgres and state.redis
        return JSONResponse(state.model_dump(), status_code=200 if ok else 503)

    return app


def _answers_sql(client: Client) -> bool:
    try:
        with client.runtime.session() as session:
            session.execute(text("SELECT 1"))
        return True
    except Exception:
        return False


def _answers_redis(client: Client) -> bool:
    try:
        return bool(client.runtime.redis.ping())
    except Exception:
        return False
