"""The dashboard's pages under ``/dashboard``: login, the jobs list (and its
live rows), one job (and its live view)."""

from __future__ import annotations

import asyncio
import urllib.parse
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from orchestrator.errors import InvalidRequestError
from orchestrator.server.dashboard import timeline, views
from orchestrator.server.dashboard.api import Api, ApiError, token_of
from orchestrator.server.dashboard.cookie import COOKIE

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
views.install(templates.env)
router = APIRouter(prefix="/dashboard", include_in_schema=False)

#: The files under static/ the dashboard serves, and their types.
STATIC = {
    "dashboard.css": "text/css",
    "dashboard.js": "text/javascript",
    "vendor/htmx-2.0.11.min.js": "text/javascript",
}
#: Filters of the jobs list, passed to ``GET /v1/runs`` as they are.
FILTERS = ("status", "agent", "tenant", "since", "until", "text", "cursor")
#: Jobs a page of the jobs list shows.
JOBS_PAGE = 25
#: Events listed on a job page (the newest).
EVENT_LOG = 200
#: Steps of a long conversation drawn unless all are asked for: its first
#: and its last ones.
FIRST_STEPS, LAST_STEPS = 5, 15
#: Events of any conversation of the tree a job page reads: what it marks.
MARKS = "llm.failed,tool.failed,subagent.failed,turn.failed,agent.handoff,checkpoint.completed"
MAX_TOKEN_CHARS = 200


def _login() -> RedirectResponse:
    return RedirectResponse("/dashboard/login", status_code=303)


def _page(request: Request, name: str, code: int = 200, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=code)


def _failed(request: Request, error: ApiError) -> Response:
    if error.status == 401:
        return _login()
    message = str(error.body.get("message", "")) or "the API refused the request"
    return _page(request, "error.html", error.status, status=error.status, message=message)


@router.get("/static/{name:path}")
def static(name: str) -> Response:
    if name not in STATIC:
        return Response("not found", status_code=404, media_type="text/plain")
    return FileResponse(
        HERE / "static" / name,
        media_type=STATIC[name],
        headers={"Cache-Control": "public, max-age=3600"},
    )


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse)
def home() -> Response:
    return RedirectResponse("/dashboard/jobs", status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> Response:
    return _page(request, "login.html")


def _cross_site(request: Request) -> bool:
    """Did another site's page send this request? A browser says so in
    ``Sec-Fetch-Site``, or, without it, by an ``Origin`` that is not this
    server (a client that sends neither is no browser page)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return False
    return urllib.parse.urlsplit(origin).netloc != request.headers.get("host")


def _refused_cross_site(request: Request) -> Response:
    message = "the dashboard's session is changed only from its own pages"
    return _page(request, "error.html", 403, status=403, message=message)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    # SameSite keeps the cookie from being sent cross-site, not from being
    # set: another site's form could log a visitor in as the attacker
    if _cross_site(request):
        return _refused_cross_site(request)
    form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    if not token or len(token) > MAX_TOKEN_CHARS or not token.isascii():
        return _page(request, "login.html", 401, error="Enter an API token.")
    try:
        async with Api(request, token) as api:
            await api.get("/v1/me")
    except ApiError as exc:
        return _page(request, "login.html", exc.status, error=exc.body.get("message", ""))
    answer = RedirectResponse("/dashboard/jobs", status_code=303)
    answer.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return answer


@router.post("/logout")
def logout(request: Request) -> Response:
    if _cross_site(request):
        return _refused_cross_site(request)
    answer = _login()
    answer.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return answer


def _filters(request: Request) -> dict[str, str]:
    return {k: v for k in FILTERS if (v := request.query_params.get(k, "").strip())}


async def _runs(request: Request, token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    filters = _filters(request)
    for key in ("since", "until"):  # <input type="datetime-local"> has no zone: UTC
        if key in filters and len(filters[key]) == 16:
            filters[key] += ":00+00:00"
    async with Api(request, token) as api:
        me = await api.get("/v1/me")
        return me, await api.get("/v1/runs", limit=JOBS_PAGE, **filters)


@router.get("/jobs", response_class=HTMLResponse)
async def jobs(request: Request) -> Response:
    token = token_of(request)
    if token is None:
        return _login()
    try:
        me, page = await _runs(request, token)
    except ApiError as exc:
        return _failed(request, exc)
    filters = _filters(request)
    rows_query = urllib.parse.urlencode({k: v for k, v in filters.items() if k != "cursor"})
    return _page(
        request,
        "jobs.html",
        me=me,
        page=page,
        filters=filters,
        rows_query=rows_query,
        next_query=_next_query(filters, page),
    )


def _next_query(filters: dict[str, str], page: dict[str, Any]) -> str | None:
    if page.get("next_cursor") is None:
        return None
    return urllib.parse.urlencode({**filters, "cursor": page["next_cursor"]})


@router.get("/jobs/rows", response_class=HTMLResponse)
async def job_rows(request: Request) -> Response:
    """The first page's rows, for the list's live refresh."""
    token = token_of(request)
    if token is None:
        return Response(status_code=401)
    try:
        _, page = await _runs(request, token)
    except ApiError as exc:
        return Response(status_code=exc.status)
    return _page(request, "_rows.html", page=page)


async def _job(request: Request, job_id: str, token: str) -> dict[str, Any]:
    """What a job page shows. Only the shown conversation's events and the
    tree's marks (failures, handoffs, checkpoints) are read whole, and the
    newest events for the list: a run of 10,000 events and 200 subagents
    opens as fast as a small one."""
    path = f"/v1/runs/{urllib.parse.quote(job_id, safe='')}"
    quoted = path.removeprefix("/v1/runs/")
    async with Api(request, token) as api:  # the API's routes run in threads: ask at once
        me, run = await asyncio.gather(api.get("/v1/me"), api.get(path))
        conversations = run["conversations"]
        shown = request.query_params.get("conversation") or run["job"]["conversation_id"]
        if shown not in {c["conversation_id"] for c in conversations}:
            raise InvalidRequestError(f"conversation: {shown[:64]!r} is not in this job's tree")
        own, marks, newest_page, waiting = await asyncio.gather(
            api.events(quoted, conversation_id=shown),
            api.events(quoted, names=MARKS),
            api.get(f"{path}/events", newest="true", limit=EVENT_LOG),
            api.get("/v1/approvals", conversation_id=run["job"]["conversation_id"]),
        )
    newest = newest_page["events"]
    seqs = {e["seq"] for e in own}
    line = timeline.build(sorted(own + [e for e in marks if e["seq"] not in seqs], key=_seq))
    return {
        "me": me,
        "run": run,
        "tree": views.tree(conversations),
        "timeline": line,
        "shown": shown,
        "shown_node": next(c for c in conversations if c["conversation_id"] == shown),
        **_steps(line.of(shown), request.query_params.get("steps") == "all"),
        "budget": views.budget(run),
        "approvals": [a for a in waiting if a["job_id"] == run["job"]["job_id"]],
        "events": newest,
        "event_count": run["events"],
        "last_seq": max((_seq(e) for e in newest), default=0),
    }


def _steps(steps: list[timeline.Step], every: bool) -> dict[str, Any]:
    """The steps drawn, and how many are left out after the first ones."""
    hidden = 0 if every else max(0, len(steps) - FIRST_STEPS - LAST_STEPS)
    if hidden:
        steps = steps[:FIRST_STEPS] + steps[-LAST_STEPS:]
    return {"steps": steps, "hidden_steps": hidden, "first_steps": FIRST_STEPS}


def _seq(event: dict[str, Any]) -> int:
    return int(event["seq"] or 0)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job(request: Request, job_id: str) -> Response:
    token = token_of(request)
    if token is None:
        return _login()
    try:
        return _page(request, "job.html", **await _job(request, job_id, token))
    except ApiError as exc:
        return _failed(request, exc)


@router.get("/jobs/{job_id}/view", response_class=HTMLResponse)
async def job_view(request: Request, job_id: str) -> Response:
    """The job's summary, tree and timeline, redrawn as live events arrive."""
    token = token_of(request)
    if token is None:
        return Response(status_code=401)
    try:
        return _page(request, "_view.html", **await _job(request, job_id, token))
    except ApiError as exc:
        return Response(status_code=exc.status)
