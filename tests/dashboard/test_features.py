"""The dashboard's other features in Chromium: the jobs list (filters,
paging, live rows), cost and budget against the API's usage, failures on
their steps, sending a message, the login cookie, and the keyboard."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect

from orchestrator import Client
from orchestrator.server.dashboard.routes import JOBS_PAGE
from orchestrator.server.dashboard.views import seconds, usd
from schemas import AgentSpec
from tests.dashboard.conftest import LoggedIn, finished, submit, tab_to
from tests.loopback_llm import LoopbackLLM

pytestmark = pytest.mark.integration


def _marker() -> str:
    """A word in the inputs of one test's jobs only: the jobs of a tenant
    the other tests share are filtered out by it."""
    return f"m{uuid.uuid4().hex[:10]}"


def _rows(page: Page) -> list[str]:
    """The ids of the jobs the list shows, in its order."""
    rows = page.locator("#job-rows tr[data-job]")
    return [str(j) for j in rows.evaluate_all("rows => rows.map(r => r.dataset.job)")]


def _filter(page: Page, **fields: str) -> None:
    """Fill the list's filters (by their labels) and apply them."""
    form = page.get_by_role("form", name="Filter jobs")
    for label, value in fields.items():
        field = form.get_by_label(label, exact=True)
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    with page.expect_navigation():
        form.get_by_role("button", name="Filter").click()


def _waiting_call(api: httpx.Client, job_id: str, timeout: float = 30.0) -> str:
    """The id of the job's call that waits for a person, once it waits."""
    conversation = api.get(f"/v1/jobs/{job_id}").json()["conversation_id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = api.get("/v1/approvals", params={"conversation_id": conversation}).json()
        if waiting:
            return str(waiting[0]["call_id"])
        time.sleep(0.1)
    raise AssertionError(f"no call of job {job_id} waits for a person after {timeout} s")


def test_the_jobs_list_filters_by_status_agent_and_text_and_pages_on_the_server(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given a job that waits (its tools' queue has no worker) and a page and
    # one more of finished ones, all with one word in their inputs
    marker = _marker()
    waiting = submit(api, "cut-lead", f"{marker} waits")
    done = [submit(api, "quick", f"{marker} q{n}") for n in range(JOBS_PAGE + 1)]
    try:
        for job_id in done:
            assert finished(api, job_id)["status"] == "completed"
        page = logged_in(tokens["acme"])

        # When the list is filtered by the word, it pages on the server:
        # a full first page, newest first, and the rest behind "Older jobs"
        _filter(page, **{"Input contains": marker})
        first = _rows(page)
        assert first == done[::-1][:JOBS_PAGE]
        page.get_by_role("link", name="Older jobs →").click()
        expect(page.locator("#job-rows tr[data-job]")).to_have_count(2)
        assert _rows(page) == [done[0], waiting]
        expect(page.get_by_role("link", name="Older jobs →")).to_have_count(0)

        # and the status, the agent and the text each narrow the rows
        page.goto(f"/dashboard/jobs?text={marker}")
        _filter(page, Status="running")
        assert _rows(page) == [waiting]
        _filter(page, Status="", Agent="cut-lead")
        assert _rows(page) == [waiting]
        _filter(page, Agent="quick", **{"Input contains": f"{marker} q7"})
        assert _rows(page) == [done[7]]
        _filter(page, Agent="quick", Status="running", **{"Input contains": marker})
        expect(page.locator("#job-rows")).to_have_text("No jobs match.")
    finally:
        api.post(f"/v1/jobs/{waiting}/cancel")


def test_a_job_submitted_while_the_list_is_open_appears_and_ends_without_reload(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given the list open, filtered to jobs no one has submitted yet
    marker = _marker()
    page = logged_in(tokens["acme"])
    page.goto(f"/dashboard/jobs?text={marker}")
    expect(page.locator("#job-rows")).to_have_text("No jobs match.")
    page.evaluate("window.__notReloaded = true")

    # When a job is submitted that waits for a person
    job_id = submit(api, "travel-desk", f"{marker} book")
    # Then its row appears, running
    row = page.locator(f'tr[data-job="{job_id}"]')
    expect(row).to_have_attribute("data-status", "running", timeout=15000)
    expect(row.locator("td").nth(9)).to_have_text("running")

    # And once it is answered and ends, its row turns completed, with the
    # steps, tokens, cost and duration the API gives it
    answer = api.post(f"/v1/approvals/{_waiting_call(api, job_id)}", json={"decision": "approve"})
    assert answer.status_code == 200, answer.text
    expect(row).to_have_attribute("data-status", "completed", timeout=30000)
    [run] = api.get("/v1/runs", params={"text": marker}).json()["runs"]
    usage = run["usage"]
    cells = [str(run["steps"]), str(usage["input_tokens"] + usage["output_tokens"])]
    cells += [usd(usage["cost_usd"]), seconds(run["seconds"])]
    expect(row.locator("td.num")).to_have_text(cells)
    assert run["steps"] == 2 and usage["input_tokens"] > 0
    assert page.evaluate("window.__notReloaded") is True  # the same document throughout


def _tokens(usage: dict[str, Any]) -> str:
    return f"{usage['input_tokens']:,} in / {usage['output_tokens']:,} out"


def _gauge(page: Page, name: str) -> Locator:
    """The label of a budget limit's meter."""
    return page.locator(f'.budget label[for="budget-{name}"]')


#: The budget of the job of the cost test.
BUDGET = {"cost_usd": 5.0, "tokens": 100000, "steps": 40}


def test_a_budget_is_shown_spent_against_its_limit_and_costs_match_the_api(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given a job with a budget that runs two priced subagents, then a call
    # that waits for a person
    job_id = submit(api, "dash-budget", "spend some", budget=BUDGET)
    page = logged_in(tokens["acme"])
    page.goto(f"/dashboard/jobs/{job_id}")

    # When the call waits (what the job spent stays put meanwhile)
    expect(page.locator("li.approval")).to_contain_text("BUD-1", timeout=20000)
    spent = api.get(f"/v1/jobs/{job_id}/usage").json()["tree_usage"]
    assert spent["cost_usd"] > 0

    # Then the page shows the budget as spent against each limit, as it runs
    expect(page.locator("#job-status")).to_have_text("running")
    cost = _gauge(page, "cost_usd")
    expect(cost).to_have_text(f"cost_usd: {round(spent['cost_usd'], 4)} of 5.0")
    meter = page.get_by_role("meter", name="cost_usd")
    expect(meter).to_have_attribute("max", "5.0")
    expect(meter).to_have_attribute("value", str(spent["cost_usd"]))
    tokens_spent = spent["input_tokens"] + spent["output_tokens"]
    expect(_gauge(page, "tokens")).to_have_text(f"tokens: {tokens_spent} of 100000")
    expect(_gauge(page, "steps")).to_have_text("steps: 4 of 40")  # 2 of its own, 1 a child

    # And once the call is approved and the job ends: the tree's tokens and
    # cost are the API's
    page.locator("li.approval button[data-approve]").click()
    expect(page.locator("#live-state")).to_have_text("Finished.", timeout=20000)
    usage = api.get(f"/v1/jobs/{job_id}/usage").json()
    tree = usage["tree_usage"]
    summary = page.locator(".summary dl")
    expect(summary.locator("div", has_text="Tokens (tree)").locator("dd")).to_have_text(
        _tokens(tree)
    )
    expect(summary.locator("div", has_text="Cost (tree)").locator("dd")).to_have_text(
        usd(tree["cost_usd"])
    )
    expect(cost).to_have_text(f"cost_usd: {round(tree['cost_usd'], 4)} of 5.0")
    # each conversation's in the tree (the job's own, each subagent's)
    conversations = api.get(f"/v1/runs/{job_id}").json()["conversations"]
    assert [c["agent"] for c in conversations] == ["dash-budget"] + ["priced-child"] * 2
    for c in conversations:
        own = api.get(f"/v1/conversations/{c['conversation_id']}/usage").json()
        node = page.locator(f'li.node[data-conversation="{c["conversation_id"]}"] > .meta')
        expect(node).to_have_text(f"{c['steps']} steps · {_tokens(own)} · {usd(own['cost_usd'])}")
        if c["agent"] == "priced-child":  # 100 + 100 tokens at 0.001 and 0.002 USD
            assert (own["input_tokens"], own["output_tokens"]) == (100, 100)
            assert own["cost_usd"] == pytest.approx(0.3)
    root = conversations[0]["conversation_id"]
    assert api.get(f"/v1/conversations/{root}/usage").json() == usage["usage"]
    # and each step's, of the job's own conversation and of a subagent's
    for c in conversations[:2]:
        if c is not conversations[0]:
            page.locator(f'li.node[data-conversation="{c["conversation_id"]}"] > a').click()
            expect(page.locator("#timeline-h")).to_contain_text(c["conversation_id"][:8])
        steps = _step_usage(api, job_id, c["conversation_id"])
        assert len(steps) == c["steps"]
        for number, (tokens_in, tokens_out, dollars) in steps.items():
            meta = page.locator(f'.step[data-step="{number}"] h3 .meta')
            expect(meta).to_contain_text(f"{tokens_in} in / {tokens_out} out · {usd(dollars)}")


def _step_usage(
    api: httpx.Client, job_id: str, conversation_id: str
) -> dict[int, tuple[int, int, float]]:
    """Tokens in, out and cost of each step of a conversation, from its usage events."""
    params = {"conversation_id": conversation_id, "names": "usage"}
    found: dict[int, tuple[int, int, float]] = {}
    for e in api.get(f"/v1/runs/{job_id}/events", params=params).json()["events"]:
        before = found.get(e["step"], (0, 0, 0.0))
        data = e["data"]
        found[e["step"]] = (
            before[0] + data["input_tokens"],
            before[1] + data["output_tokens"],
            before[2] + data["cost_usd"],
        )
    return found


#: What the loopback model answers its second call with.
REFUSAL = "the prompt is too long for loopback"


def test_a_model_failure_shows_the_providers_status_and_body_and_a_tool_failure_its_error(
    logged_in: LoggedIn, tokens: dict[str, str], client: Client, api: httpx.Client
) -> None:
    # Given a job whose model calls a tool that raises, then fails with a 400
    with LoopbackLLM() as model:
        model.enqueue_tool_calls([("explode", {"reason": "on purpose"})])
        model.enqueue_error(400, message=REFUSAL)
        spec = AgentSpec(
            name="dash-failing",
            model="openai/loopback-model",
            tools=["explode"],
            model_settings={"api_base": model.base_url},
        )
        job = client.submit(spec, "fail twice", context_data={"tenant": "acme"}, tenant="acme")
        assert finished(api, job.id)["status"] == "failed"
    [failed] = [
        e["data"]
        for e in api.get(f"/v1/runs/{job.id}/events", params={"names": "llm.failed"}).json()[
            "events"
        ]
    ]
    assert failed["status"] == 400 and REFUSAL in failed["body"]

    # When its page opens
    page = logged_in(tokens["acme"])
    page.goto(f"/dashboard/jobs/{job.id}")

    # Then the step of the tool shows the tool's error
    tool = page.locator('.step[data-step="0"] .failure-row[data-kind="tool"]')
    expect(tool).to_contain_text("explode failed")
    expect(tool).to_contain_text("exploded: on purpose")
    # and the step of the model call the provider's status and body, as sent
    model_row = page.locator('.step[data-step="1"] .failure-row[data-kind="model"]')
    expect(model_row.locator(".provider-status")).to_have_text("400")
    expect(model_row.locator(".provider-body")).to_have_text(failed["body"])
    # And the failures listed above the tree say so too, each linked to its step
    failures = page.locator("ul.failures li").filter(has=page.get_by_role("link"))
    expect(failures).to_have_count(2)
    listed = failures.filter(has_text="model call failed (status 400)")
    expect(listed.locator("pre")).to_have_text(failed["body"])
    for text, step in (("tool explode failed", 0), ("model call failed", 1)):
        failures.filter(has_text=text).get_by_role("link").click()
        expect(page).to_have_url(re.compile(rf"#step-{job.conversation_id}-{step}$"))
        expect(page.locator(f"#step-{job.conversation_id}-{step}")).to_be_in_viewport()


def test_a_message_sent_from_the_page_reaches_the_conversation_and_runs_a_turn(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given a finished job's page
    job_id = submit(api, "quick", "first words")
    first = finished(api, job_id)
    page = logged_in(tokens["acme"])
    page.goto(f"/dashboard/jobs/{job_id}")

    # When a message is sent from it
    page.get_by_label("Send a message").fill("second words")
    page.get_by_role("button", name="Send", exact=True).click()

    # Then a new turn of the job's conversation runs on it
    result = page.locator("#action-result")
    expect(result).to_have_text(re.compile(r"^Sent: it started job \S+\.$"))
    started = (result.text_content() or "").removeprefix("Sent: it started job ").rstrip(".")
    turn = finished(api, started)
    assert turn["status"] == "completed" and started != job_id
    assert turn["conversation_id"] == first["conversation_id"]
    assert api.get(f"/v1/jobs/{started}/result").json()["output"] == "ok: second words"
    history = api.get(f"/v1/conversations/{first['conversation_id']}/messages").json()
    said = [b["text"] for m in history if m["role"] == "user" for b in m["content"]]
    assert said == ["first words", "second words"]
    expect(page.get_by_label("Send a message")).to_have_value("")


def test_the_token_is_in_an_http_only_strict_cookie_and_never_in_a_url(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given a job that runs (its page follows it live)
    job_id = submit(api, "cut-lead", "cookie")
    try:
        # When a token logs in and opens the list, a filter and the job's page
        token = tokens["acme"]
        page = logged_in(token)
        _filter(page, Agent="cut-lead")
        page.goto(f"/dashboard/jobs/{job_id}")
        expect(page.locator("#live-state")).to_have_text("Live.")

        # Then the token is in one cookie, http-only and SameSite=Strict,
        # that the page's scripts cannot read
        [cookie] = [c for c in page.context.cookies() if c["value"] == token]
        assert cookie["name"] == "chorus_token"
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert token not in page.evaluate("document.cookie")
        assert token not in page.content()
        # and no URL the browser asked for holds it (the login, the pages,
        # their redraws and the API's event stream among them)
        asked = logged_in.urls
        assert any(u.endswith("/dashboard/login") for u in asked)
        assert any(f"/v1/jobs/{job_id}/events" in u for u in asked)
        assert [u for u in asked if token in u or token.split("_")[-1] in u] == []

        # And logging out removes the cookie
        page.get_by_role("button", name="Log out").click()
        page.wait_for_url("**/dashboard/login")
        assert [c for c in page.context.cookies() if c["name"] == "chorus_token"] == []
    finally:
        api.post(f"/v1/jobs/{job_id}/cancel")


def _unnamed(page: Page) -> list[str]:
    """The form controls and links of the page that have no accessible name."""
    snapshot = page.locator("body").aria_snapshot()
    controls = r"^\s*- (textbox|searchbox|combobox|button|link|checkbox|spinbutton)\b(?! \")"
    return [line for line in snapshot.splitlines() if re.search(controls, line)]


#: Resolves once the jobs list's rows were next refreshed (every 2 s).
AFTER_REFRESH = """() => new Promise(done =>
  document.getElementById("job-rows").addEventListener("htmx:afterSettle", done, {once: true}))"""


def _focus_shows(page: Page) -> bool:
    """The element that has the focus is drawn with an outline."""
    style = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    return bool(style not in ("none", ""))


#: WCAG's least contrast of normal text (level AA).
LEAST_CONTRAST = 4.5
#: Every shown element with text of its own, and the WCAG contrast of its
#: text's colour against the first opaque background behind it.
CONTRAST = """
() => {
  const rgba = c => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = v => (v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const behind = el => {
    for (; el; el = el.parentElement) {
      const c = rgba(getComputedStyle(el).backgroundColor);
      if (c.length === 3 || c[3] > 0.5) return c;
    }
    return [255, 255, 255];
  };
  const found = new Map();
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || found.has(el) || !el.getClientRects().length) continue;
    const style = getComputedStyle(el);
    if (style.visibility === "hidden") continue;
    const [a, b] = [lum(rgba(style.color)), lum(behind(el))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const text = n.textContent.trim().slice(0, 30);
    found.set(el, [el.tagName + "." + el.className + " " + text, ratio]);
  }
  return [...found.values()];
}
"""


def _low_contrast(page: Page) -> list[tuple[str, float]]:
    """The texts of the page whose contrast is below :data:`LEAST_CONTRAST`."""
    found = page.evaluate(CONTRAST)
    assert len(found) > 10, found  # the page's texts were read
    return [(text, round(ratio, 2)) for text, ratio in found if ratio < LEAST_CONTRAST]


def test_the_main_actions_are_reached_by_tab_and_taken_with_enter_and_inputs_are_labelled(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given a job waiting for a person and one that waits for a worker
    marker = _marker()
    asks = submit(api, "travel-desk", f"{marker} keys")
    waits = submit(api, "cut-lead", f"{marker} keys")
    try:
        # When a person logs in with the keyboard alone
        page = logged_in(tokens["acme"], keyboard=True)
        # Then every filter has a label, and no control of the page is unnamed
        form = page.get_by_role("form", name="Filter jobs")
        for label in ("Status", "Agent", "Started from (UTC)", "until", "Input contains"):
            expect(form.get_by_label(label, exact=True)).to_have_count(1)
        assert _unnamed(page) == []
        assert _low_contrast(page) == []  # and every text stands out from its background

        # and the list is filtered by keyboard, the focus drawn on each control
        tab_to(page, 'input[name="text"]')
        assert _focus_shows(page)
        page.keyboard.type(marker)
        page.keyboard.press("Enter")
        expect(page.locator("#job-rows tr[data-job]")).to_have_count(2)

        # and a job's page is opened by keyboard: the call waiting there is
        # approved by Tab and Enter
        tab_to(page, f'tr[data-job="{asks}"] a')
        page.evaluate(AFTER_REFRESH)  # the list's refresh keeps the focus where it was
        assert page.evaluate("document.activeElement.closest('tr')?.dataset.job") == asks
        page.keyboard.press("Enter")
        page.wait_for_url(f"**/dashboard/jobs/{asks}")
        expect(page.locator("li.approval")).to_contain_text("LIS-123", timeout=30000)
        assert _unnamed(page) == []
        assert _low_contrast(page) == []
        tab_to(page, "li.approval button[data-approve]")
        assert _focus_shows(page)
        page.keyboard.press("Enter")
        expect(page.locator("#action-result")).to_have_text("Approved by dash-acme.")
        expect(page.locator("#job-status")).to_have_text("completed", timeout=30000)

        # and the other job is cancelled by Tab and Enter
        page.goto(f"/dashboard/jobs/{waits}")
        expect(page.locator("#live-state")).to_have_text("Live.")
        tab_to(page, "#cancel")
        assert _focus_shows(page)
        page.keyboard.press("Enter")
        expect(page.locator("#action-result")).to_contain_text("Cancel requested")
        assert finished(api, waits, timeout=15)["status"] == "cancelled"
    finally:
        api.post(f"/v1/jobs/{waits}/cancel")
        api.post(f"/v1/jobs/{asks}/cancel")


#: Sets ``window.redrawn``: a promise resolved once the job page's view is
#: next redrawn.
NEXT_REDRAW = """() => { window.redrawn = new Promise(done => new MutationObserver((_, seen) => {
  seen.disconnect(); done(true);
}).observe(document.getElementById("view"), {childList: true})); }"""


def test_a_redraw_keeps_the_reason_being_typed_and_the_focus(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given a job page where a person types why a call is denied
    job_id = submit(api, "travel-desk", "keep my words")
    conversation = api.get(f"/v1/jobs/{job_id}").json()["conversation_id"]
    try:
        page = logged_in(tokens["acme"])
        page.goto(f"/dashboard/jobs/{job_id}")
        expect(page.locator("li.approval")).to_contain_text("LIS-123", timeout=30000)
        expect(page.locator(".lane[data-tool='lookup_city']")).to_have_attribute(
            "data-status", "completed", timeout=30000
        )  # the job's last event until the answer: no redraw comes meanwhile
        tab_to(page, "li.approval input")
        page.keyboard.type("not on a Friday")

        # When an event of the job redraws the page (a message queued to it)
        page.evaluate(NEXT_REDRAW)
        sent = api.post(f"/v1/conversations/{conversation}/messages", json={"text": "later"})
        assert sent.status_code == 202, sent.text
        assert page.evaluate("window.redrawn") is True
        expect(page.locator("#events li", has_text="message.queued")).to_have_count(1)

        # Then what was typed is still there, and the keyboard still in it
        reason = page.locator("li.approval input")
        expect(reason).to_have_value("not on a Friday")
        expect(reason).to_be_focused()
        tab_to(page, "li.approval button[data-deny]")
        page.keyboard.press("Enter")
        expect(page.locator("#action-result")).to_have_text("Denied by dash-acme.")
        assert api.delete(f"/v1/conversations/{conversation}/queue").json()["cleared"] == 1
        expect(page.locator("#job-status")).to_have_text("completed", timeout=30000)
        answer = api.get(f"/v1/jobs/{job_id}/result").json()["output"]
        assert "denied: not on a Friday" in answer
    finally:
        api.post(f"/v1/jobs/{job_id}/cancel")
        api.delete(f"/v1/conversations/{conversation}/queue")
