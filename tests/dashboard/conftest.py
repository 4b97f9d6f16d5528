"""The dashboard in a real browser: the system's Chromium driven by
Playwright, against the shared `chorus server` (tests/server/conftest.py)
on the shared test fleet."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, ViewportSize, sync_playwright

from orchestrator import Client
from tests.server.conftest import Server, bearer, make_token
from tests.server.conftest import server as server  # the shared `chorus server`

CHROMIUM = os.environ.get("CHORUS_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]


def submit(api: httpx.Client, agent: str, text: str, **body: Any) -> str:
    """Submit a job of ``agent`` over HTTP (``body``: more of the request,
    e.g. ``budget``); its id."""
    answer = api.post("/v1/jobs", json={"agent": agent, "input": text, **body})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["job_id"])


def finished(api: httpx.Client, job_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """The job's status once it no longer runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found: dict[str, Any] = api.get(f"/v1/jobs/{job_id}").json()
        if found["status"] != "running":
            return found
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} still runs after {timeout} s")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def tokens(client: Client) -> dict[str, str]:
    """Tokens of tenant ``acme`` (submit, read) and of tenant ``initech``."""
    return {
        "acme": make_token(client, "acme", "submit", "dash-acme"),
        "reader": make_token(client, "acme", "read", "dash-reader"),
        "initech": make_token(client, "initech", "submit", "dash-initech"),
    }


@pytest.fixture
def api(server: Server, tokens: dict[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=bearer(tokens["acme"]), timeout=30) as h:
        yield h


#: How many Tab presses :func:`tab_to` tries before it gives up.
MOST_TABS = 60


def tab_to(page: Page, selector: str) -> None:
    """Press Tab until the element ``selector`` has the focus (as a person
    with a keyboard reaches it): fails if it is never reached."""
    for _ in range(MOST_TABS):
        page.keyboard.press("Tab")
        if page.evaluate("s => document.activeElement === document.querySelector(s)", selector):
            return
    raise AssertionError(f"{selector} is not reached by Tab")


class LoggedIn:
    """Logs in: a page of a fresh browser context, logged in with the token
    given (at ``url``: the server's, unless another reaches it), by mouse or
    by keyboard alone. ``urls``: every URL any of its pages asked for."""

    def __init__(self, browser: Browser, server: Server) -> None:
        self.browser, self.server = browser, server
        self.urls: list[str] = []
        self.contexts: list[BrowserContext] = []

    def __call__(self, token: str, url: str | None = None, keyboard: bool = False) -> Page:
        viewport: ViewportSize = {"width": 1440, "height": 900}
        context = self.browser.new_context(base_url=url or self.server.url, viewport=viewport)
        self.contexts.append(context)
        context.on("request", lambda request: self.urls.append(request.url))
        page = context.new_page()
        page.goto("/dashboard/login")
        if keyboard:
            tab_to(page, "#token")
            page.keyboard.type(token)
            page.keyboard.press("Enter")
        else:
            page.get_by_label("API token").fill(token)
            page.get_by_role("button", name="Log in").click()
        page.wait_for_url("**/dashboard/jobs")
        return page

    def close(self) -> None:
        for context in self.contexts:
            context.close()


@pytest.fixture
def logged_in(browser: Browser, server: Server) -> Iterator[LoggedIn]:
    login = LoggedIn(browser, server)
    yield login
    login.close()
