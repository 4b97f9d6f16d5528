"""The dashboard in a real browser: the system's Chromium driven by
Playwright, against the shared `chorus server` (tests/server/conftest.py)
on the shared test fleet."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Protocol

import httpx
import pytest
from playwright.sync_api import Browser, Page, ViewportSize, sync_playwright

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


class LoggedIn(Protocol):
    def __call__(self, token: str, url: str | None = None) -> Page: ...


@pytest.fixture
def logged_in(browser: Browser, server: Server) -> Iterator[LoggedIn]:
    """A page of a fresh browser context, logged in with the token given
    (at ``url``: the server's, unless another reaches it)."""
    contexts = []

    def login(token: str, url: str | None = None) -> Page:
        viewport: ViewportSize = {"width": 1440, "height": 900}
        context = browser.new_context(base_url=url or server.url, viewport=viewport)
        contexts.append(context)
        page = context.new_page()
        page.goto("/dashboard/login")
        page.get_by_label("API token").fill(token)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url("**/dashboard/jobs")
        return page

    yield login
    for context in contexts:
        context.close()
