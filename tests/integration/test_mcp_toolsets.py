"""MCP toolsets against a real MCP server (tests/mcp_server.py), over stdio
and streamable HTTP, through real worker processes.

The fleet is this module's own: its workers must see the URL of the HTTP
server the module starts, and its tools worker also serves the ``mcp``
queue of the ``mcp_http`` server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator import (
    ChorusError,
    Client,
    MCPServer,
    Settings,
    ToolContext,
    registry,
    tool,
)
from orchestrator.tools import toolsets
from schemas import AgentSpec, EventName
from tests.conftest import ROOT, WorkerProcess, tool_calls
from tests.faults import free_port
from tests.fleet import started
from tests.loopback_llm import LoopbackLLM

pytestmark = pytest.mark.integration

#: The test server's tools as it serves them (tests/mcp_server.py).
ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"title": "Text", "type": "string"}},
    "required": ["text"],
    "title": "echoArguments",
}


@contextmanager
def http_server(state_dir: Path) -> Iterator[str]:
    """The test MCP server over streamable HTTP, once it accepts connections."""
    port = free_port()
    log = state_dir / f"mcp-http-{port}.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_server", "http", str(port)],
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"MCP server did not start:\n{log.read_text()}") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture(scope="module")
def mcp_url(settings: Settings) -> Iterator[str]:
    with http_server(Path(settings.state_dir)) as url:
        yield url


@pytest.fixture(scope="module")
def mcp_fleet(settings: Settings, mcp_url: str) -> Iterator[Client]:
    """An llm worker and a tools worker (tools and mcp queues) that know the URL."""
    own = settings.model_copy(
        update={"redis_prefix": f"{settings.redis_prefix}-mcp{uuid.uuid4().hex[:6]}"}
    )
    client = Client(own)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CHORUS_TEST_MCP_URL", mcp_url)
        fleet = [
            # (no mingle: on a prefix of their own there is no other worker to ask)
            WorkerProcess(
                own, "mcp-llm", "-Q", "llm,control", "-P", "threads", "-c", "4", "--without-mingle"
            ),
            WorkerProcess(
                own, "mcp-tools", "-Q", "tools,mcp", "-P", "prefork", "-c", "4", "--without-mingle"
            ),
        ]
    try:
        with started(client, fleet):
            yield client
    finally:
        client.close()


@pytest.mark.long
def test_stdio_tools_return_fail_time_out_and_stay_within_the_agent(mcp_fleet: Client) -> None:
    # Given an agent with the stdio server, whose model calls a tool that
    # returns, one that fails, one slower than the server's 3 s timeout, and
    # a tool of a server its agent does not list
    job = mcp_fleet.submit("mcp-stdio", "go")

    # Then the turn finishes, with one result per call
    answer = job.result(timeout=90)
    calls = {c.tool: c for c in tool_calls(mcp_fleet, job.id)}
    assert set(calls) == {"mcp_stdio.echo", "mcp_stdio.fail", "mcp_stdio.slow", "mcp_http.echo"}

    # The echo reached the server with the call's tool request id in _meta
    echo = calls["mcp_stdio.echo"]
    assert not echo.is_error, echo.result
    assert echo.result["text"] == "hello"
    assert echo.result["meta"]["chorus/tool_request_id"] == echo.id  # the call's own id

    # The failure and the timeout are error results naming what happened
    fail, slow = calls["mcp_stdio.fail"], calls["mcp_stdio.slow"]
    assert fail.is_error and "failing on purpose: boom" in str(fail.result)
    assert slow.is_error and "timed out after 3s" in str(slow.result)
    assert "failing on purpose: boom" in answer and "timed out" in answer

    # The other server's tool was refused and never started
    refused = calls["mcp_http.echo"]
    assert refused.is_error
    assert refused.result == "Error: tool 'mcp_http.echo' is not available to agent 'mcp-stdio'"
    started = {e.data["tool"] for e in job.events(deltas=False) if e.name is EventName.TOOL_STARTED}
    assert started == {"mcp_stdio.echo", "mcp_stdio.fail", "mcp_stdio.slow"}


def test_http_tools_are_offered_with_their_schemas_and_called(mcp_fleet: Client) -> None:
    with LoopbackLLM() as model:
        # Given a model that calls the server's echo tool
        agent = AgentSpec(
            name="mcp-loopback",
            model="openai/loopback-model",
            toolsets=("mcp_http",),
            model_settings={"api_base": model.base_url},
        )
        model.enqueue_tool_calls([("mcp_http__echo", {"text": "over http"})])
        model.enqueue_text("Done.")

        # When the fleet runs a turn
        job = mcp_fleet.submit(agent, "echo something")
        assert job.result(timeout=60) == "Done."
        first, second = model.requests

    # Then the model was offered the server's tools as the server lists them
    offered = {t["function"]["name"]: t["function"] for t in first["tools"]}
    # (under provider-legal aliases; no read_tool_output: no output was cut)
    assert set(offered) == {"mcp_http__echo", "mcp_http__fail", "mcp_http__slow"}
    assert offered["mcp_http__echo"]["parameters"] == ECHO_SCHEMA
    assert (
        offered["mcp_http__echo"]["description"] == "Say the text back, with the request's _meta."
    )

    # And the call ran on the server's own queue and reached it with the request id
    (call,) = tool_calls(mcp_fleet, job.id)
    assert call.tool == "mcp_http.echo"
    assert not call.is_error and call.result["text"] == "over http"
    assert call.result["meta"]["chorus/tool_request_id"] == call.id
    tool_message = next(m for m in second["messages"] if m["role"] == "tool")
    assert json.loads(tool_message["content"])["text"] == "over http"


def test_a_server_that_is_down_gives_error_results_and_the_turn_finishes(
    mcp_fleet: Client,
) -> None:
    # Given an agent whose MCP server is not running, and a plain tool
    job = mcp_fleet.submit("mcp-down", "try")

    # Then the turn finishes: the server's tool was not offered (it could
    # not be listed), so its call is refused; the plain tool ran
    job.result(timeout=60)
    calls = {c.tool: c for c in tool_calls(mcp_fleet, job.id)}
    down = calls["mcp_down.echo"]
    assert down.is_error
    assert down.result == "Error: tool 'mcp_down.echo' is not available to agent 'mcp-down'"
    assert (calls["add"].is_error, calls["add"].result) == (False, 3)
    # and a name that no tool can have is an error result, not a failed turn
    assert calls["mcp_down.no such tool"].is_error
    assert job.status().status == "completed"
    # A server that is down when called: an error result naming the server
    ctx = ToolContext("conversation", "root", "turn", "request-1")
    with pytest.raises(ChorusError, match="'mcp_down': tools/call 'echo' failed: ConnectError"):
        registry.get_tool("mcp_down.echo").invoke({"text": "anyone?"}, ctx)


def test_mcp_server_declarations_are_checked() -> None:
    from orchestrator import (
        ConfigurationError,
        InvalidRequestError,
        MCPServer,
        SecretInSettingsError,
    )

    with pytest.raises(InvalidRequestError, match="exactly one of url and command"):
        MCPServer("neither")
    with pytest.raises(InvalidRequestError, match="exactly one of url and command"):
        MCPServer("both", url="http://127.0.0.1:1/mcp", command=["server"])
    with pytest.raises(InvalidRequestError, match="the name must be"):
        MCPServer("a.b", url="http://127.0.0.1:1/mcp")
    with pytest.raises(SecretInSettingsError, match="credentials"):
        MCPServer("creds", url="http://user:pw@127.0.0.1:1/mcp")
    # a server's namespace holds only its own tools: a function registered
    # there would run for any agent listing the server
    MCPServer("mcp_ns", url="http://127.0.0.1:1/mcp")
    with pytest.raises(ConfigurationError, match="namespace of MCP server 'mcp_ns'"):
        tool(namespace="mcp_ns")(_double)
    tool(namespace="ns_first")(_double)
    with pytest.raises(ConfigurationError, match="namespace already holds the tool 'ns_first"):
        MCPServer("ns_first", url="http://127.0.0.1:1/mcp")


def _double(x: int) -> int:
    """Double it.

    Args:
        x: a number.
    """
    return 2 * x


def test_an_agent_naming_an_unknown_mcp_server_is_refused(mcp_fleet: Client) -> None:
    from orchestrator import UnknownToolError

    agent = AgentSpec(name="mcp-nowhere", model="scripted/mcp-stdio", toolsets=("nowhere",))
    with pytest.raises(UnknownToolError, match="unknown MCP server 'nowhere'"):
        mcp_fleet.submit(agent, "hi")


def test_the_readme_example_runs(mcp_fleet: Client) -> None:
    # The README's weather planner (tests/readme.py) calls the example server's
    # forecast over stdio, through the fleet
    job = mcp_fleet.submit("weather-planner", "Weather in Lisbon?")
    answer = job.result(timeout=90)
    assert json.loads(answer.removeprefix("Lisbon: ")) == {
        "city": "Lisbon",
        "sky": "clear",
        "temperature": 21,
    }
    (call,) = tool_calls(mcp_fleet, job.id)
    assert call.tool == "weather.forecast" and not call.is_error


def test_a_server_that_goes_down_keeps_its_last_known_tools(tmp_path: Path) -> None:
    # Given a server listed once (its list is never fresh: cache_seconds=0)
    with http_server(tmp_path) as url:
        flaky = MCPServer("mcp_flaky", url=url, cache_seconds=0)
        listed = toolsets.offered(flaky.name)
        # (not `broken`: its input schema is invalid, and one bad schema
        # would make the provider refuse the whole request)
        assert [t.name for t in listed] == ["mcp_flaky.echo", "mcp_flaky.fail", "mcp_flaky.slow"]
        assert listed[0].parameters == ECHO_SCHEMA and listed[0].queue == "tools"

    # When it is down, discovery offers the last known list
    assert toolsets.offered(flaky.name) == listed
    # and a server never reached offers nothing; neither raises
    never = MCPServer("mcp_never", url=url, cache_seconds=0)
    assert toolsets.offered(never.name) == []


def test_a_header_comes_from_the_environment_variable_the_declaration_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = ToolContext("conversation", "root", "turn", "request-1")
    with http_server(tmp_path) as url:
        MCPServer("mcp_auth", url=url, headers={"Authorization": "CHORUS_TEST_MCP_TOKEN"})
        echo = registry.get_tool("mcp_auth.echo")

        # Unset: the call fails naming the variable
        monkeypatch.delenv("CHORUS_TEST_MCP_TOKEN", raising=False)
        with pytest.raises(ChorusError, match="environment variable CHORUS_TEST_MCP_TOKEN"):
            echo.invoke({"text": "hi"}, ctx)

        # Set: the server receives its value
        monkeypatch.setenv("CHORUS_TEST_MCP_TOKEN", "Bearer not-a-real-token")
        said = echo.invoke({"text": "hi"}, ctx)
    assert said["authorization"] == "Bearer not-a-real-token"
    assert said["meta"]["chorus/tool_request_id"] == "request-1"


def test_a_server_namespace_admits_only_the_tools_the_step_offered(mcp_fleet: Client) -> None:
    with LoopbackLLM() as model:
        # Given a model that calls a listed tool, the tool the server lists
        # with an invalid schema (not offered) and one the server never listed
        agent = AgentSpec(
            name="mcp-offered",
            model="openai/loopback-model",
            toolsets=("mcp_stdio",),
            model_settings={"api_base": model.base_url},
        )
        model.enqueue_tool_calls(
            [
                ("mcp_stdio__echo", {"text": "listed"}),
                ("mcp_stdio.broken", {"x": 1}),
                ("mcp_stdio.unlisted", {}),
            ]
        )
        model.enqueue_text("Done.")
        job = mcp_fleet.submit(agent, "go")
        assert job.result(timeout=60) == "Done."

    # Then only the offered tool ran; the others were refused in the step
    calls = {c.tool: c for c in tool_calls(mcp_fleet, job.id)}
    assert not calls["mcp_stdio.echo"].is_error
    for name in ("mcp_stdio.broken", "mcp_stdio.unlisted"):
        assert calls[name].is_error
        assert calls[name].result == f"Error: tool {name!r} is not available to agent 'mcp-offered'"
    started = {e.data["tool"] for e in job.events(deltas=False) if e.name is EventName.TOOL_STARTED}
    assert started == {"mcp_stdio.echo"}


def _echo_pids(client: Client, model: LoopbackLLM, agent: AgentSpec, calls: int) -> list[int]:
    """Run a turn of ``calls`` parallel echo calls; the server pid of each."""
    model.enqueue_tool_calls([("mcp_stdio__echo", {"text": str(i)}) for i in range(calls)])
    model.enqueue_text("Done.")
    job = client.submit(agent, "echo")
    assert job.result(timeout=60) == "Done."
    results = [c for c in tool_calls(client, job.id)]
    assert [c.is_error for c in results] == [False] * calls, [c.result for c in results]
    return [int(c.result["pid"]) for c in results]


def test_a_stdio_server_runs_once_per_worker_process_and_again_after_it_died(
    mcp_fleet: Client,
) -> None:
    with LoopbackLLM() as model:
        agent = AgentSpec(
            name="mcp-kept",
            model="openai/loopback-model",
            toolsets=("mcp_stdio",),
            model_settings={"api_base": model.base_url},
        )
        # When two turns make twelve calls to the stdio server
        pids = _echo_pids(mcp_fleet, model, agent, 6) + _echo_pids(mcp_fleet, model, agent, 6)
        # Then they were served by at most one server process per pool
        # process of the tools worker (prefork, 4 children), not one per call
        assert len(set(pids)) <= 4, pids

        # When those servers die, the next calls start new ones and succeed
        for pid in set(pids):
            os.kill(pid, signal.SIGKILL)
        again = _echo_pids(mcp_fleet, model, agent, 4)
    assert not set(again) & set(pids)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_stdio_session_is_shared_replaced_after_a_timeout_and_closed_when_idle() -> None:
    ctx = ToolContext("conversation", "root", "turn", "request-1")
    kept = MCPServer(
        "mcp_kept",
        command=[sys.executable, "-m", "tests.mcp_server", "stdio"],
        cwd=str(ROOT),
        timeout=2,
        idle_seconds=1,
    )
    echo, slow = (registry.get_tool(f"{kept.name}.{name}") for name in ("echo", "slow"))
    # Calls from many threads of one process share one server process
    with ThreadPoolExecutor(8) as threads:
        said = list(threads.map(lambda i: echo.invoke({"text": str(i)}, ctx), range(8)))
    (pid,) = {s["pid"] for s in said}
    # A call that times out leaves that server to close; the next call starts another
    with pytest.raises(ChorusError, match="timed out after 2s"):
        slow.invoke({"seconds": 30}, ctx)
    after = echo.invoke({"text": "again"}, ctx)["pid"]
    assert after != pid
    # and each closes: the stuck one, and the new one once idle for a second
    deadline = time.monotonic() + 30
    while (_running(pid) or _running(after)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(pid) and not _running(after)
