"""Errors as JSON: ``{"type": <ChorusError class name>, "message", "fields"}``,
with the HTTP status its meaning says."""

from __future__ import annotations

import logging
from typing import Any

import redis
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from orchestrator.errors import (
    AuthenticationError,
    ChorusError,
    ConversationBusyError,
    ConversationNotFound,
    InvalidRequestError,
    JobFailedError,
    JobNotFinishedError,
    JobNotFound,
    PermissionDeniedError,
    ServiceUnavailableError,
    ToolOutputNotFound,
    UserError,
)

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    """What every error answers with."""

    type: str
    message: str
    fields: list[str] = []


#: The status of each error, first match wins (subclasses before their bases).
#: The approvals' ``ConflictError`` answers 409 as well (add it here).
STATUSES: tuple[tuple[type[ChorusError], int], ...] = (
    (AuthenticationError, 401),
    (PermissionDeniedError, 403),
    (JobNotFound, 404),
    (ConversationNotFound, 404),
    (ToolOutputNotFound, 404),
    (ConversationBusyError, 409),
    (JobNotFinishedError, 409),
    (JobFailedError, 409),
    (InvalidRequestError, 422),
    (UserError, 400),
    (ServiceUnavailableError, 503),
)

#: The statuses a route documents: every route may answer these.
COMMON = (400, 401, 403, 404, 409, 422, 503)


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entries of these error statuses."""
    return {code: {"model": ErrorBody, "description": _MEANING[code]} for code in codes}


_MEANING = {
    400: "Bad request: names something not registered",
    401: "No token, or an unknown, malformed or revoked one",
    403: "The token's scope does not allow this",
    404: "No such job or conversation (for this token's tenant)",
    409: "Conflicts with the job's or conversation's state",
    422: "The request failed validation (fields names what)",
    503: "Postgres or Redis is unavailable; retry",
}


def status_of(exc: ChorusError) -> int:
    for cls, status in STATUSES:
        if isinstance(exc, cls):
            return status
    return 500


def body(exc: ChorusError) -> dict[str, Any]:
    fields = exc.fields if isinstance(exc, InvalidRequestError) else []
    return ErrorBody(type=type(exc).__name__, message=str(exc), fields=fields).model_dump()


def _answer(exc: ChorusError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthenticationError) else None
    return JSONResponse(body(exc), status_code=status_of(exc), headers=headers)


def _field(loc: tuple[int | str, ...]) -> str:
    parts = loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc
    return ".".join(str(p) for p in parts)


async def _chorus(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ChorusError)
    return _answer(exc)


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    fields = [_field(tuple(e.get("loc", ()))) for e in errors]
    detail = "; ".join(
        f"{f or 'request'}: {e.get('msg', 'invalid')}" for f, e in zip(fields, errors, strict=True)
    )
    return _answer(InvalidRequestError(f"invalid request: {detail}", fields))


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    error = ErrorBody(type="HTTPError", message=str(exc.detail), fields=[])
    return JSONResponse(error.model_dump(), status_code=exc.status_code, headers=exc.headers)


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    return _answer(ServiceUnavailableError(f"a service is unavailable: {type(exc).__name__}"))


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    error = ErrorBody(type="InternalError", message="the server failed; it is logged", fields=[])
    return JSONResponse(error.model_dump(), status_code=500)


def install(app: FastAPI) -> None:
    """Answer every error as :class:`ErrorBody` (an unexpected one as a 500
    ``InternalError``, its traceback logged, never sent)."""
    app.add_exception_handler(Exception, _internal)
    app.add_exception_handler(ChorusError, _chorus)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    for outage in (sqlalchemy.exc.OperationalError, redis.ConnectionError, redis.TimeoutError):
        app.add_exception_handler(outage, _unavailable)
