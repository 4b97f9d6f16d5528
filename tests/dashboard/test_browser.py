"""The dashboard in Chromium: a job's shape, live events across a dropped
stream (and a server restart, behind ``-m slow``), streamed text, cancel,
approvals and their waits, what a read-only token and another tenant see,
a big run."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, Route, expect

from orchestrator import Client, Settings
from orchestrator.store import token_sql
from schemas import AgentSpec
from tests.approval_agents import HOSTILE_FLIGHT
from tests.conftest import ROOT
from tests.dashboard.bigrun import EVENTS, store_big_run
from tests.dashboard.conftest import LoggedIn, finished, submit
from tests.dashboard.relay import Relay
from tests.loopback_llm import LoopbackLLM
from tests.server.conftest import Server, bearer, make_token, start_server

pytestmark = pytest.mark.integration

#: A job page of the big run must have loaded within this (the issue's bound).
BIG_RUN_SECONDS = 2.0
SCREENSHOT = ROOT / "docs" / "dashboard.png"


def _stored_seqs(api: httpx.Client, job_id: str) -> list[int]:
    page = api.get(f"/v1/runs/{job_id}/events", params={"limit": 5000}).json()
    return [e["seq"] for e in page["events"]]


def test_a_job_shows_its_lanes_barrier_straggler_and_nested_tree(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given a finished job: three parallel tools (p3 the slowest), a call that
    # runs alone, and a subagent that has a subagent of its own
    job_id = submit(api, "dash-lead", "show me the shape")
    assert finished(api, job_id)["status"] == "completed"

    # When its page opens
    page = logged_in(tokens["acme"])
    expect(page.locator(f'tr[data-job="{job_id}"]')).to_contain_text("completed")
    page.locator(f'tr[data-job="{job_id}"] a').click()
    page.wait_for_url(f"**/dashboard/jobs/{job_id}")

    # Then step 0 has three lanes in one segment, p3 named as its straggler
    step = page.locator('.step[data-step="0"]')
    parallel = step.locator('.segment[data-segment="0"]')
    expect(parallel.locator(".lane")).to_have_count(3)
    expect(parallel.locator(".lane.straggler")).to_have_count(1)
    expect(parallel.locator(".lane.straggler .label")).to_contain_text("'p3'")
    expect(parallel.locator(".straggler-name")).to_contain_text("'p3'")
    for lane in parallel.locator(".lane").all():  # queue wait drawn apart from run time
        expect(lane.locator(".bar.queue")).to_have_count(1)
        expect(lane.locator(".bar.run")).to_have_count(1)
    # the barrier call is a segment of its own, then the subagent's
    alone = step.locator('.segment[data-segment="1"]')
    expect(alone).to_have_class("segment alone")
    expect(alone.locator(".lane")).to_have_attribute("data-tool", "timed_barrier")
    expect(step.locator('.segment[data-segment="2"] .lane')).to_have_attribute(
        "data-tool", "subagent__deep-researcher"
    )
    expect(step.locator(".mark")).to_have_count(5)  # every lane shows its segment's barrier
    # the tree nests root > deep-researcher > researcher, with usage on each
    tree = page.locator("nav.tree")
    deep = tree.locator('li.node[data-agent="deep-researcher"]')
    expect(deep).to_have_attribute("data-depth", "1")
    expect(deep.locator('li.node[data-agent="researcher"]')).to_have_attribute("data-depth", "2")
    expect(tree.locator("li.node").first).to_have_attribute("data-agent", "dash-lead")
    expect(page.locator("#job-status")).to_have_text("completed")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=False)

    # And the researcher's own timeline opens from the tree
    deep.locator('li.node[data-agent="researcher"] > a').click()
    expect(page.locator('.lane[data-tool="timed"]')).to_have_count(1)


#: Every change of a job page's banner and status, as the page showed them
#: (one entry per task that changed either: a mutation observer's batch).
WATCH = """
window.__shown = [];
new MutationObserver(function () {
  const banner = document.getElementById("live-state");
  const status = document.getElementById("job-status");
  if (banner && status) window.__shown.push([banner.textContent, status.textContent]);
}).observe(document, {subtree: true, childList: true, characterData: true});
"""
#: Seconds every redraw's answer is held back (a slow network) in the
#: dropped-stream test: the stream's end comes before the last one lands.
LATE = 0.6


def _late_redraws(page: Page, failing: int) -> list[str]:
    """Hold back the answer of every redraw of the page by :data:`LATE`
    seconds, and drop the first ``failing`` that show the job completed
    (the URLs of those dropped are listed in what is returned)."""
    dropped: list[str] = []

    def late(route: Route) -> None:
        try:
            answer = route.fetch()
        except PlaywrightError:  # the network dropped it: so does the page's
            route.abort("connectionreset")
            return
        if 'id="job-status">completed<' in answer.text() and len(dropped) < failing:
            dropped.append(route.request.url)
            route.abort("connectionreset")
            return
        time.sleep(LATE)  # the page goes on meanwhile: its stream is not held
        route.fulfill(response=answer)

    page.route("**/dashboard/jobs/*/view*", late)
    return dropped


def _follows_to_the_end(page: Page, api: httpx.Client, job_id: str) -> None:
    """The page shows every stored event of the job exactly once, in order,
    never dropped one the server sent, and was never reloaded."""
    shown = [
        int(s)
        for s in page.locator("#events li").evaluate_all("items => items.map(li => li.dataset.seq)")
    ]
    assert shown == _stored_seqs(api, job_id)
    live = page.evaluate("({d: window.chorusLive.duplicates, c: window.chorusLive.connections})")
    assert live["d"] == 0  # the server never sent one twice (the page would have dropped it)
    assert live["c"] >= 2  # it connected again (as often as it took)
    assert page.url.endswith(f"/dashboard/jobs/{job_id}")  # never reloaded


def test_a_dropped_stream_resumes_and_the_end_shows_with_the_final_state(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str], server: Server
) -> None:
    # Given the page of a running job (two 3 s tools), reached through a
    # relay, whose redraws land late and whose first two redraws showing
    # its end fail
    with Relay(int(server.url.rsplit(":", 1)[1])) as relay:
        page = logged_in(tokens["acme"], relay.url)
        page.add_init_script(WATCH)
        dropped = _late_redraws(page, failing=2)
        job_id = submit(api, "dash-brief", "live please")
        page.goto(f"/dashboard/jobs/{job_id}")
        expect(page.locator("#live-state")).to_have_text("Live.")
        expect(page.locator("#events li", has_text="tool.requested")).to_have_count(2)

        # When the network drops every connection of the page (its stream too)
        relay.cut()

        # Then the page reconnects, follows the job to its end, and says it
        # finished only together with the status it ended with: never
        # "Finished." beside "running", though the end came before the
        # last redraw landed
        expect(page.locator("#live-state")).to_have_text("Finished.", timeout=30000)
        expect(page.locator("#job-status")).to_have_text("completed", timeout=1)
        expect(page.locator('.step[data-step="1"]')).to_have_count(1)  # the last step drawn
        assert len(dropped) == 2  # the redraws that failed were tried again
        shown = page.evaluate("window.__shown")
        finished = [s for s in shown if s[0] == "Finished."]
        assert finished and all(status == "completed" for _, status in finished), finished
        _follows_to_the_end(page, api, job_id)


def _restart(server: Server, settings: Settings) -> Server:
    """Kill the server and start another on its port."""
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)
    port = int(server.url.rsplit(":", 1)[1])
    return start_server(settings, Path(settings.state_dir) / "dashboard-server-2.log", port=port)


@pytest.mark.slow  # 12-40 s (10 s tools, a server start): the dropped stream is its short form
def test_a_running_job_updates_live_and_resumes_after_the_server_restarts(
    api: httpx.Client,
    logged_in: LoggedIn,
    tokens: dict[str, str],
    server: Server,
    settings: Settings,
) -> None:
    # Given the page of a job whose three tools take 10 s, open as it runs
    page = logged_in(tokens["acme"])
    job_id = submit(api, "dash-slow", "live please")
    page.goto(f"/dashboard/jobs/{job_id}")
    expect(page.locator("#live-state")).to_have_text("Live.")
    # the calls are asked (tool.started is stored with a call's result,
    # when it has ended: waiting for it let the job end before the restart)
    expect(page.locator("#events li", has_text="tool.requested")).to_have_count(3, timeout=15000)

    # When the server dies under the open stream, while the tools run, and comes back
    restarted = _restart(server, settings)
    server.proc = restarted.proc  # the session's fixture stops this one

    # Then the page reconnects, follows the job to its end without reload,
    # and lists every stored event exactly once, in order; it says it
    # finished when it shows the status the job ended with
    expect(page.locator("#live-state")).to_have_text("Finished.", timeout=30000)
    expect(page.locator("#job-status")).to_have_text("completed", timeout=1)
    _follows_to_the_end(page, api, job_id)


#: What the streaming model says, a word every 0.1 s.
SPOKEN = " ".join(f"w{i}" for i in range(40))


def test_streamed_text_appears_as_it_comes_and_the_reply_replaces_it(
    logged_in: LoggedIn, tokens: dict[str, str], client: Client
) -> None:
    with LoopbackLLM() as model:
        # Given the page of a job whose model streams its answer slowly
        model.enqueue_text(SPOKEN, chunk_delay=0.1, delay=1.0)
        spec = AgentSpec(
            name="dash-streamer",
            model="openai/loopback-model",
            model_settings={"api_base": model.base_url},
        )
        # as a submit over HTTP with acme's token
        job = client.submit(spec, "talk slowly", context_data={"tenant": "acme"}, tenant="acme")
        page = logged_in(tokens["acme"])
        page.goto(f"/dashboard/jobs/{job.id}")

        # When it streams, part of its text is on the page while the call runs
        partial = page.wait_for_function(
            """() => {
              const b = document.querySelector('#stream .live-text[data-state="streaming"]');
              const text = b ? b.querySelector("pre").textContent : "";
              return text.split(" ").length > 2 ? text : null;
            }""",
            timeout=30000,
        ).json_value()
        assert partial in SPOKEN and len(partial) < len(SPOKEN), partial
        block = page.locator("#stream .live-text")
        expect(block.locator("h3")).to_contain_text("dash-streamer")  # named from the tree
        expect(block.locator("h3")).to_contain_text("step 0")

        # Then the reply as stored replaces it, and the model call's bar
        # marks its first token
        expect(block).to_have_attribute("data-state", "final", timeout=30000)
        expect(block.locator("pre")).to_have_text(SPOKEN)
    expect(page.locator("#live-state")).to_have_text("Finished.", timeout=15000)
    expect(page.locator("#stream .live-text")).to_have_count(1)
    mark = page.locator('.step[data-step="0"] .model-row .tick.ttft')
    expect(mark).to_have_attribute("title", re.compile(r"^first token after [0-9.]+ m?s$"))


def test_cancel_from_the_page_stops_the_tree(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given a running job with a sleeping tool and a subagent
    page = logged_in(tokens["acme"])
    job_id = submit(api, "busy-lead", "cancel me")
    page.goto(f"/dashboard/jobs/{job_id}")
    expect(page.locator(".lane", has_text="subagent__sleepy-child")).to_have_count(1, timeout=15000)

    # When its Cancel button is pressed
    page.get_by_role("button", name="Cancel job and its subagents").click()

    # Then the API says the job and its subagent were cancelled
    expect(page.locator("#action-result")).to_contain_text("Cancel requested")
    assert finished(api, job_id, timeout=15)["status"] == "cancelled"
    tree = api.get(f"/v1/runs/{job_id}").json()["conversations"]
    assert [c["status"] for c in tree] == ["cancelled", "cancelled"]
    expect(page.locator("#job-status")).to_have_text("cancelled", timeout=10000)


def test_a_read_only_token_sees_no_actions_and_cannot_act(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str], client: Client
) -> None:
    job_id = submit(api, "cut-lead", "read only")  # its tools' queue has no worker: it waits
    page = logged_in(tokens["reader"])
    page.goto(f"/dashboard/jobs/{job_id}")
    expect(page.locator("#job-status")).to_be_visible()
    expect(page.locator("#cancel")).to_have_count(0)
    expect(page.locator("#send")).to_have_count(0)
    # a cancel sent with its cookie anyway is refused by the API
    status = page.evaluate(
        """id => fetch(`/v1/jobs/${id}/cancel`, {method: "POST",
             headers: {"X-Chorus-Dashboard": "1"}}).then(r => r.status)""",
        job_id,
    )
    assert status == 403
    # and without the dashboard's header the cookie alone cannot change anything
    acme = logged_in(tokens["acme"])
    acme.goto(f"/dashboard/jobs/{job_id}")
    status = acme.evaluate(
        "id => fetch(`/v1/jobs/${id}/cancel`, {method: 'POST'}).then(r => r.status)", job_id
    )
    assert status == 403
    assert api.get(f"/v1/jobs/{job_id}").json()["status"] == "running"
    client.job(job_id).cancel()


def test_a_call_waiting_for_a_person_is_answered_from_the_page(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given two jobs whose book_flight call waits for a person (travel-desk)
    approved, denied = (submit(api, "travel-desk", f"book {n}") for n in ("one", "two"))
    # A read-only token sees what waits, and no buttons
    reader = logged_in(tokens["reader"])
    reader.goto(f"/dashboard/jobs/{approved}")
    expect(reader.locator("li.approval")).to_contain_text("book_flight", timeout=30000)
    expect(reader.locator("li.approval button")).to_have_count(0)

    # When one is approved from its page (the item appears live)
    page = logged_in(tokens["acme"])
    page.goto(f"/dashboard/jobs/{approved}")
    item = page.locator("li.approval")
    expect(item).to_contain_text("LIS-123", timeout=30000)
    item.locator("button[data-approve]").click()
    # Then it runs once, the turn completes and the item is gone
    expect(page.locator("#action-result")).to_have_text("Approved by dash-acme.")
    expect(page.locator("#job-status")).to_have_text("completed", timeout=30000)
    expect(page.locator("li.approval")).to_have_count(0)
    assert "booked LIS-123" in api.get(f"/v1/jobs/{approved}/result").json()["output"]
    # and its timeline draws the wait for a person apart from queue and run
    # time, and the first token of each model call
    lane = page.locator('.step[data-step="0"] .lane[data-tool="book_flight"]')
    waited = lane.locator('.bar.wait[data-reason="approval"]')
    expect(waited).to_have_attribute("title", re.compile(r"approved by dash-acme\)$"))
    expect(lane.locator(".approval-label")).to_contain_text("approval")
    expect(lane.locator(".bar.queue")).to_have_count(2)  # claimed, then run once approved
    expect(lane.locator(".bar.run")).to_have_count(1)
    expect(page.locator(".model-row .tick.ttft")).to_have_count(2)  # both steps streamed

    # And the other is denied only with a reason, which the model gets
    page.goto(f"/dashboard/jobs/{denied}")
    expect(page.locator("li.approval")).to_contain_text("book_flight", timeout=30000)
    page.locator("li.approval button[data-deny]").click()
    expect(page.locator("#action-result")).to_have_text("A denial needs a reason.")
    page.locator("li.approval input").fill("not on a Friday")
    page.locator("li.approval button[data-deny]").click()
    expect(page.locator("#job-status")).to_have_text("completed", timeout=30000)
    answer = api.get(f"/v1/jobs/{denied}/result").json()["output"]
    assert "denied: not on a Friday" in answer
    names = [e["name"] for e in api.get(f"/v1/runs/{denied}/events").json()["events"]]
    assert names.count("tool.denied") == 1 and "tool.approved" not in names


def test_a_step_held_by_the_agents_rate_limit_shows_why_it_waited(
    server: Server, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    # Given two jobs of an agent that may call its model once per 8 s per
    # tenant (sweep-deferred), submitted at once by one tenant
    with httpx.Client(base_url=server.url, headers=bearer(tokens["initech"]), timeout=30) as api:
        jobs = [submit(api, "sweep-deferred", f"limited {n}") for n in (1, 2)]
        for job_id in jobs:
            assert finished(api, job_id, timeout=40)["status"] == "completed"
    # When their pages are opened
    page = logged_in(tokens["initech"])
    waits = {}
    for job_id in jobs:
        page.goto(f"/dashboard/jobs/{job_id}")
        expect(page.locator("#job-status")).to_have_text("completed")
        waits[job_id] = page.locator('.wait-row[data-reason="rate limit"]').count()
    # Then one of them (the limit let the other's call through) shows its
    # step's wait for the limit, with the reason and how long it was held
    assert sorted(waits.values()) == [0, 1], waits
    page.goto(f"/dashboard/jobs/{max(waits, key=lambda j: waits[j])}")
    row = page.locator('.wait-row[data-reason="rate limit"]')
    expect(row.locator(".label")).to_have_text("wait: rate limit")
    held = re.compile(r"^held \d+\.\d s by the agent's rate limits before it was sent$")
    expect(row.locator(".bar.wait")).to_have_attribute("title", held)


def test_a_page_whose_token_is_revoked_stops_following_and_says_so(
    api: httpx.Client, logged_in: LoggedIn, client: Client
) -> None:
    # Given a job page following a job that waits for a person
    token = make_token(client, "acme", "read", "dash-revoked")
    page = logged_in(token)
    job_id = submit(api, "travel-desk", "revoke the page")
    try:
        page.goto(f"/dashboard/jobs/{job_id}")
        expect(page.locator("li.approval")).to_contain_text("book_flight", timeout=30000)
        expect(page.locator("#live-state")).to_have_text("Live.")

        # When its token is revoked
        with client.runtime.session() as session:
            assert token_sql.revoke(session, token.split("_")[1]) == 1

        # Then the page says so within the bound and does not reconnect
        expect(page.locator("#live-state")).to_have_text(
            "The token is no longer valid (the token was revoked); log in again.",
            timeout=10000,
        )
        connections = page.evaluate("window.chorusLive.connections")
        page.wait_for_timeout(3000)
        assert page.evaluate("window.chorusLive.connections") == connections
    finally:
        api.post(f"/v1/jobs/{job_id}/cancel")


def test_a_hostile_call_is_shown_as_its_text_and_runs_nothing(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    """A model's arguments with markup, a quote and non-ASCII letters: the
    person who answers reads them as they are, and the page runs none of it."""
    job_id = submit(api, "hostile-desk", "book it")
    page = logged_in(tokens["acme"])
    page.goto(f"/dashboard/jobs/{job_id}")
    shown = page.locator("li.approval pre")
    expect(shown).to_contain_text("flight", timeout=30000)
    assert json.loads(shown.inner_text()) == {"flight": HOSTILE_FLIGHT}
    assert "\\u00fc" not in shown.inner_text() and "O'Brien Zürich" in shown.inner_text()
    assert page.evaluate("window.__xss") is None
    assert page.locator("li.approval script, li.approval img").count() == 0
    api.post(f"/v1/jobs/{job_id}/cancel")


def test_another_tenants_job_is_not_reachable(
    api: httpx.Client, logged_in: LoggedIn, tokens: dict[str, str]
) -> None:
    job_id = submit(api, "quick", "acme only")
    finished(api, job_id)
    page = logged_in(tokens["initech"])
    expect(page.locator(f'tr[data-job="{job_id}"]')).to_have_count(0)
    answer = page.goto(f"/dashboard/jobs/{job_id}")
    assert answer is not None and answer.status == 404
    status = page.evaluate("id => fetch(`/v1/jobs/${id}`).then(r => r.status)", job_id)
    assert status == 404
    # and the page never puts the token in a URL
    assert tokens["initech"] not in page.url


#: Scrolls a box (the page when the selector is null) to its end, ``step``
#: px a frame, as a person dragging fast does: each frame's time, in ms
#: (requestAnimationFrame's clock), and how far it went.
SCROLL = """
async ([selector, step]) => {
  const box = selector ? document.querySelector(selector) : document.scrollingElement;
  const frame = () => new Promise(resolve => requestAnimationFrame(resolve));
  const frames = [];
  box.scrollTop = 0;
  let last = await frame();
  while (box.scrollTop + box.clientHeight < box.scrollHeight - 1) {
    box.scrollTop += step;
    const now = await frame();
    frames.push(now - last);
    last = now;
  }
  return {frames: frames, height: box.scrollHeight};
}
"""
#: Pixels a frame of the scroll measure.
SCROLL_STEP = 120


def _scrolled(page: Page, selector: str | None, what: str) -> str:
    """Scroll ``selector`` (None: the page) to its end a frame at a time;
    its frame times, as a line of the report."""
    found = page.evaluate(SCROLL, [selector, SCROLL_STEP])
    frames = sorted(found["frames"])
    assert len(frames) > 2, f"{what} is no taller than its box: nothing was scrolled"
    p95 = frames[min(len(frames) - 1, round(0.95 * len(frames)))]
    return (
        f"{what} ({found['height']} px, {len(frames)} frames): "
        f"longest frame {frames[-1]:.1f} ms, p95 {p95:.1f} ms"
    )


#: A site of an attacker's (Playwright answers for it: no network).
EVIL = "http://evil.test/"


@pytest.mark.parametrize("action", ["login", "logout"])
def test_another_sites_form_cannot_log_the_dashboard_in_or_out(
    server: Server, logged_in: LoggedIn, tokens: dict[str, str], action: str
) -> None:
    """A page of another site that posts a form to /dashboard/login swapped
    the visitor's session for the attacker's tenant (what they then sent or
    approved went to the attacker); one posting to /dashboard/logout ended it."""
    # Given a visitor logged in as acme who opens a page of another site
    page = logged_in(tokens["acme"])
    form = (
        f'<form method="post" action="{server.url}/dashboard/{action}">'
        f'<input name="token" value="{tokens["initech"]}"></form>'
        "<script>document.forms[0].submit()</script>"
    )
    page.route(EVIL, lambda route: route.fulfill(content_type="text/html", body=form))
    # When that page posts its form to the dashboard
    with page.expect_response(f"{server.url}/dashboard/{action}") as posted:
        page.goto(EVIL)
    assert posted.value.status == 403
    # Then the visitor's session is still acme's
    [cookie] = [c for c in page.context.cookies(server.url) if c["name"] == "chorus_token"]
    assert cookie["value"] == tokens["acme"]
    page.goto(f"{server.url}/dashboard/jobs")
    expect(page.locator(".who")).to_contain_text("tenant acme")
    # And the dashboard's own form still logs out (its own login form logged in)
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/dashboard/login")
    assert not [c for c in page.context.cookies(server.url) if c["name"] == "chorus_token"]


def test_a_run_of_ten_thousand_events_and_200_subagents_opens_within_the_bound(
    logged_in: LoggedIn, tokens: dict[str, str], client: Client
) -> None:
    # Given a finished run of 10,000 events whose root fanned out to 200 subagents
    job_id = store_big_run(client, "acme")
    page = logged_in(tokens["acme"])

    # When its page is opened four times (the machine runs other tests at
    # once: the fastest open is the page's own cost, all three are printed)
    opens, server = [], []
    for _ in range(4):
        began = time.monotonic()
        page.goto(f"/dashboard/jobs/{job_id}")
        page.locator("nav.tree li.node").nth(200).wait_for()
        opens.append(time.monotonic() - began)
        server.append(
            page.evaluate(
                "(() => { const n = performance.getEntriesByType('navigation')[0];"
                " return n.responseStart - n.requestStart; })()"
            )
        )

    # Then the whole tree is there, the events are counted, and it opened in time
    expect(page.locator("nav.tree li.node")).to_have_count(201)
    expect(page.locator("#events-h")).to_contain_text(f"{EVENTS}")
    expect(page.locator('.step[data-step="0"] .lane')).to_have_count(200)
    print(
        f"big run ({EVENTS} events, 200 subagents): opened in "
        + ", ".join(
            f"{o:.2f} s (server {s / 1000:.2f} s)" for o, s in zip(opens, server, strict=True)
        )
    )
    # The bound (BIG_RUN_SECONDS) is reported, not asserted: a timed assertion
    # fails with the machine's load, not with the page.
    print(f"fastest open {min(opens):.2f} s against a bound of {BIG_RUN_SECONDS} s")

    # And it scrolls: the page (the step of 200 lanes among 20 drawn), the
    # tree of 201 conversations and the newest 200 events, each to its end
    # a frame at a time; each frame's time is reported (16.7 ms is 60 fps)
    for selector, what in ((None, "page"), ("nav.tree > ul", "tree"), ("#events", "events")):
        print("scrolled the big run's " + _scrolled(page, selector, what))
    # and so does its page with every step drawn
    page.goto(f"/dashboard/jobs/{job_id}?steps=all")
    steps = page.locator(".step").count()
    print("scrolled the big run's " + _scrolled(page, None, f"page of all {steps} steps"))
