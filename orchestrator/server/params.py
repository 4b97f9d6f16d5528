"""Path, query and header parameters shared by the routes."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, Header, Path, Query

from orchestrator.client import MAX_ID_CHARS, MAX_SEQ
from orchestrator.errors import InvalidRequestError
from orchestrator.trace_context import JobTrace

JobId = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS)]
ConversationId = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS)]
EntryId = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS)]
CallId = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS)]
Deltas = Annotated[bool, Query(description="Include live `assistant.delta` events.")]
LastEventQuery = Annotated[
    int | None,
    Query(ge=0, le=MAX_SEQ, description="Resume after this seq (for clients without headers)."),
]
LastEventHeader = Annotated[
    str | None,
    Header(alias="Last-Event-ID", description="Resume after this seq (sent on reconnect)."),
]


_SEQ = re.compile(r"[0-9]{1,19}")


def _resume_after(
    last_event_id: LastEventQuery = None, last_event_header: LastEventHeader = None
) -> int:
    """The seq to resume after: the query parameter, else the header, else 0."""
    header, query = last_event_header, last_event_id
    if query is not None:
        return query
    if header is None or header.strip() == "":
        return 0
    # ASCII digits only: str.isdigit() takes "²", which int() refuses, and
    # int() refuses more than 4300 digits
    if not _SEQ.fullmatch(header.strip()) or int(header) > MAX_SEQ:
        raise InvalidRequestError(
            f"Last-Event-ID: expected an event seq from 0 to {MAX_SEQ}", ["Last-Event-ID"]
        )
    return int(header)


#: An event stream's resume point: ``?last_event_id=``, else ``Last-Event-ID``, else 0.
ResumeAfter = Annotated[int, Depends(_resume_after)]


TraceParentHeader = Annotated[
    str | None,
    Header(
        alias="traceparent",
        description=(
            "A W3C traceparent: the job's trace joins the caller's (ignored if not valid)."
        ),
    ),
]


def _trace_parent(traceparent: TraceParentHeader = None) -> str | None:
    """The request's ``traceparent``, if it is a valid one. An invalid one is
    ignored, as W3C Trace Context asks of a receiver: the job gets a trace
    of its own and the submit still succeeds."""
    if traceparent is None:
        return None
    try:
        JobTrace.parse(traceparent)
    except InvalidRequestError:
        return None
    return traceparent


#: The trace a submitted job joins: the request's valid ``traceparent``, else None.
TraceParent = Annotated[str | None, Depends(_trace_parent)]
