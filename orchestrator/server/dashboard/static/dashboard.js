// The job page, live: one EventSource on the API's job stream, resumed
// after the last event seq it saw (every event shown exactly once), the
// summary, tree and timeline redrawn from the server as events arrive, the
// text each model call streams shown as it comes, and the actions the
// token may take (cancel, send, answer a call waiting for approval) as
// plain API calls.
(function () {
  "use strict";
  const job = document.getElementById("job");
  if (!job) return;
  const id = job.dataset.job;
  const base = "/v1/jobs/" + encodeURIComponent(id);
  const names = [
    "turn.started", "turn.completed", "turn.failed", "turn.cancelled",
    "llm.requested", "llm.completed", "llm.failed", "assistant.delta", "assistant.message",
    "tool.requested", "tool.started", "tool.completed", "tool.failed", "tool.cancelled",
    "tool.approval_requested", "tool.approved", "tool.denied",
    "subagent.requested", "subagent.started", "subagent.completed", "subagent.failed",
    "subagent.stopped", "agent.handoff", "plan.updated", "message.queued",
    "message.dequeued", "queue.cleared", "queue.unread", "checkpoint.started",
    "checkpoint.completed", "usage", "budget.exceeded",
  ];
  const state = document.getElementById("live-state");
  const log = document.getElementById("events");
  const view = document.getElementById("view");
  const seen = new Set();
  log.querySelectorAll("li[data-seq]").forEach(function (li) { seen.add(Number(li.dataset.seq)); });
  let last = Number(job.dataset.lastSeq || 0);
  let source = null;
  let ended = job.dataset.running !== "true";  // the stream ended after the job's turn did
  let done = ended;  // the job's own turn ended (its terminal event was seen)
  const terminal = ["turn.completed", "turn.failed", "turn.cancelled"];
  let delay = 500;
  const live = { seen: seen, duplicates: 0, connections: 0, last: function () { return last; } };
  window.chorusLive = live;

  // Redraw the summary, tree and timeline from the server, one request at
  // a time: a reason to redraw while one is in flight asks for one more
  // after it, and a redraw that failed (an error answer, a dropped
  // request, the server restarting) is tried again, after 500 ms doubling
  // up to 2 s, until one lands. So the last redraw always lands, whatever
  // order it and the stream's end come in.
  const PAUSE = 250;
  let wanted = false;  // a redraw is due
  let loggedOut = false;  // the stream said the token is no longer valid
  let drawing = false;
  let timer = null;
  let backoff = PAUSE;
  function refresh(after) {
    wanted = true;
    if (drawing || timer !== null) return;
    timer = setTimeout(draw, after === undefined ? PAUSE : after);
  }
  async function draw() {
    timer = null;
    drawing = true;
    wanted = false;
    let landed = false;
    let refused = 0;
    try {
      const url = "/dashboard/jobs/" + encodeURIComponent(id) + "/view" + window.location.search;
      const answer = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (answer.ok) {
        const html = await answer.text();
        const kept = keep();
        view.innerHTML = html;
        restore(kept);
        landed = true;
      } else if (answer.status >= 400 && answer.status < 500 && [408, 429].indexOf(answer.status) < 0) {
        refused = answer.status;  // e.g. logged out: asking again would not help
      }
    } catch (error) {
      landed = false;  // the server went away: tried again below
    }
    drawing = false;
    if (refused) {
      if (loggedOut) return;  // the stream said why already
      state.textContent = refused === 401
        ? "The token is no longer valid; log in again."
        : "The page can no longer be redrawn (HTTP " + refused + "); reload it.";
      return;
    }
    if (!landed) {
      backoff = Math.min(backoff * 2, 2000);
      refresh(backoff);
      return;
    }
    backoff = PAUSE;
    if (loggedOut) return;
    if (ended) settle();
    if (wanted) refresh();
  }

  // What a redraw must not take from a person: the reasons to deny typed
  // so far, and the focus (and the caret) on a control of the view.
  function keyOf(el) {
    for (const name of ["data-approve", "data-deny", "data-reason-for"]) {
      if (el.hasAttribute(name)) return "[" + name + '="' + CSS.escape(el.getAttribute(name)) + '"]';
    }
    const node = el.closest("li.node[data-conversation]");
    if (node && el.matches("a")) {
      return 'li.node[data-conversation="' + CSS.escape(node.dataset.conversation) + '"] > a';
    }
    return null;
  }
  function keep() {
    const typed = [];
    view.querySelectorAll("input[data-reason-for]").forEach(function (input) {
      if (input.value) typed.push([keyOf(input), input.value]);
    });
    const active = document.activeElement;
    const focus = active && view.contains(active) ? keyOf(active) : null;
    const caret = focus && active.matches("input") ? [active.selectionStart, active.selectionEnd] : null;
    return { typed: typed, focus: focus, caret: caret };
  }
  function restore(kept) {
    kept.typed.forEach(function (entry) {
      const input = view.querySelector(entry[0]);
      if (input) input.value = entry[1];
    });
    const found = kept.focus ? view.querySelector(kept.focus) : null;
    if (!found) return;
    found.focus({ preventScroll: true });
    if (kept.caret) found.setSelectionRange(kept.caret[0], kept.caret[1]);
  }

  // Once the stream ended after the job's turn, the page says so in the
  // same moment it shows the status the job ended with: when a redraw
  // lands whose status is no longer "running", never before.
  function settle() {
    const status = view.querySelector("#job-status");
    if (status && status.textContent.trim() === "running") {
      refresh();  // drawn before the end could be read: draw again
      return;
    }
    state.textContent = "Finished.";
    const cancel = document.getElementById("cancel");
    if (cancel) cancel.hidden = true;
  }

  function append(event) {
    const li = document.createElement("li");
    li.dataset.seq = String(event.seq);
    const seq = document.createElement("span");
    seq.className = "seq";
    seq.textContent = "#" + event.seq;
    const name = document.createElement("strong");
    name.textContent = event.name;
    const time = document.createElement("time");
    time.textContent = String(event.time).slice(11, 23);
    const conv = document.createElement("span");
    conv.className = "conv";
    conv.textContent = event.conversation_id.slice(0, 8);
    li.append(seq, " ", time, " ", name, " ", conv);
    const extra = (event.step !== null ? " step " + event.step : "") +
      (event.data && event.data.tool ? " · " + event.data.tool : "");
    li.append(extra);
    log.append(li);
  }

  // The text of each conversation's current model call as it streams
  // (assistant.delta, live only), replaced by the reply as stored
  // (assistant.message) when the call ends: one block a conversation.
  const streams = document.getElementById("stream");
  const idle = document.getElementById("stream-idle");
  function block(event) {
    const key = event.conversation_id;
    let found = streams.querySelector('article[data-conversation="' + CSS.escape(key) + '"]');
    if (!found) {
      found = document.createElement("article");
      found.className = "live-text";
      found.dataset.conversation = key;
      const pre = document.createElement("pre");
      pre.setAttribute("aria-live", "off");
      found.append(document.createElement("h3"), pre);
      streams.append(found);
      if (idle) idle.hidden = true;
    }
    if (found.dataset.step !== String(event.step)) {  // a new call: its own text
      found.dataset.step = String(event.step);
      found.querySelector("pre").textContent = "";
    }
    return found;
  }
  function label(found, what) {
    const node = view.querySelector(
      'li.node[data-conversation="' + CSS.escape(found.dataset.conversation) + '"]');
    const agent = node ? node.dataset.agent + " " : "";
    found.querySelector("h3").textContent = agent + found.dataset.conversation.slice(0, 8) +
      " · step " + found.dataset.step + " · " + what;
  }
  function streamed(event) {
    const found = block(event);
    if (found.dataset.state !== "streaming") {
      found.dataset.state = "streaming";
      label(found, "streaming…");
    }
    found.querySelector("pre").append(event.data.text);
  }
  function replied(event) {
    const data = event.data || {};
    const text = typeof data.text === "string" ? data.text : "";
    const open = streams.querySelector(
      'article[data-conversation="' + CSS.escape(event.conversation_id) + '"]');
    if (!text && !open) return;  // no text, and none was streamed before: nothing to show
    const found = block(event);
    found.dataset.state = "final";
    const calls = Number(data.tool_calls || 0);
    label(found, "reply" + (calls ? " (and " + calls + " tool call" + (calls > 1 ? "s" : "") + ")" : ""));
    found.querySelector("pre").textContent = text;
  }

  // The job's turn ended and the stream with it: the banner says so when
  // a redraw after it lands (settle).
  function finish() {
    ended = true;
    if (source) source.close();
    state.textContent = "The job's turn ended; drawing its final state…";
    refresh();
  }

  function handle(message) {
    const event = JSON.parse(message.data);
    if (event.seq === null || event.seq === undefined) {
      if (event.data && typeof event.data.text === "string") streamed(event);
      return;
    }
    if (seen.has(event.seq)) { live.duplicates += 1; return; }
    seen.add(event.seq);
    last = Math.max(last, event.seq);
    if (event.turn_id === id && terminal.indexOf(event.name) >= 0) done = true;
    append(event);
    if (event.name === "assistant.message") replied(event);
    if (event.name !== "usage") refresh();
  }

  function connect() {
    // The resume point is in the URL, so a reconnect is a new EventSource
    // made here (the browser's own retry would resend the first URL).
    source = new EventSource(base + "/events?deltas=true&last_event_id=" + last);
    live.connections += 1;
    source.onopen = function () { delay = 500; state.textContent = "Live."; };
    names.forEach(function (name) { source.addEventListener(name, handle); });
    // The stream ends after the job's turn ends; one that ends (or fails)
    // before that is opened again after the last event, like a dropped one.
    source.addEventListener("end", function () {
      if (done) { finish(); } else { retry("The stream ended early"); }
    });
    source.addEventListener("error", function (e) {
      const error = e.data ? JSON.parse(e.data) : null;
      // a revoked token: reconnecting would only be refused (401)
      if (error && error.type === "AuthenticationError") {
        loggedOut = true;
        ended = true;  // neither reconnect nor redraw: both would be refused
        source.close();
        state.textContent = "The token is no longer valid (" + error.message + "); log in again.";
        return;
      }
      retry(error ? "The stream failed: " + error.message : "Connection lost");
    });
  }

  function retry(why) {
    source.close();
    if (ended) return;
    state.textContent = why + "; reconnecting after event #" + last + "…";
    setTimeout(connect, delay);
    delay = Math.min(delay * 2, 2000);
  }

  if (!ended) connect();

  function say(text) { document.getElementById("action-result").textContent = text; }

  async function call(method, url, body) {
    const answer = await fetch(url, {
      method: method,
      credentials: "same-origin",
      headers: Object.assign({ "X-Chorus-Dashboard": "1" }, body ? { "Content-Type": "application/json" } : {}),
      body: body ? JSON.stringify(body) : undefined,
    });
    const data = await answer.json().catch(function () { return {}; });
    if (!answer.ok) throw new Error(data.message || ("HTTP " + answer.status));
    return data;
  }

  const cancel = document.getElementById("cancel");
  if (cancel) cancel.addEventListener("click", async function () {
    cancel.disabled = true;
    try {
      const found = await call("POST", base + "/cancel");
      say("Cancel requested: the job is " + found.status + ".");
    } catch (error) { say("Cancel failed: " + error.message); cancel.disabled = false; }
  });

  // Approve or deny a call waiting for a person (buttons in the redrawn view)
  document.getElementById("view").addEventListener("click", async function (e) {
    const button = e.target;
    if (!(button instanceof HTMLButtonElement)) return;
    const callId = button.dataset.approve || button.dataset.deny;
    if (!callId) return;
    let body = { decision: "approve" };
    if (button.dataset.deny) {
      const input = document.querySelector('input[data-reason-for="' + CSS.escape(callId) + '"]');
      const reason = input ? input.value.trim() : "";
      if (!reason) { say("A denial needs a reason."); return; }
      body = { decision: "deny", reason: reason };
    }
    button.disabled = true;
    try {
      const answered = await call("POST", "/v1/approvals/" + encodeURIComponent(callId), body);
      say((answered.decision === "approved" ? "Approved" : "Denied") + " by " + answered.by + ".");
      refresh();
    } catch (error) { say("Answer failed: " + error.message); button.disabled = false; }
  });

  // Send a message. The API answers before the turn it starts is stored
  // (job_id null, even for an idle conversation): the page asks for the
  // message's job until there is one, 250 ms doubling up to 2 s apart.
  const send = document.getElementById("send");
  const QUEUE_POLLS = 300;
  function pause(ms) { return new Promise(function (done) { setTimeout(done, ms); }); }
  async function started(conversation, entry) {
    const url = conversation + "/queue/" + encodeURIComponent(entry);
    for (let n = 0, wait = 250; n < QUEUE_POLLS; n += 1, wait = Math.min(wait * 2, 2000)) {
      await pause(wait);
      const found = await call("GET", url).catch(function () { return null; });
      if (found && found.job_id) return found.job_id;
    }
    return null;
  }
  if (send) send.addEventListener("submit", async function (e) {
    e.preventDefault();
    const input = document.getElementById("message");
    const conversation = "/v1/conversations/" + encodeURIComponent(send.dataset.conversation);
    let sent;
    try {
      sent = await call("POST", conversation + "/messages", { text: input.value });
    } catch (error) { say("Send failed: " + error.message); return; }
    input.value = "";
    if (!sent.job_id) {
      say("Sent: queued; a turn starts on it when the conversation is free.");
      sent.job_id = await started(conversation, sent.entry_id);
    }
    if (sent.job_id) say("Sent: it started job " + sent.job_id + ".");
  });
})();
