"""The ``chorus`` command line. Heavy imports (litellm, Celery) happen inside
commands, so ``chorus --help`` stays fast."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from rich.console import Console
from rich.text import Text

from orchestrator.errors import UserError
from schemas.jobs import DEFAULT_PRIORITY

if TYPE_CHECKING:
    import socket

    from orchestrator.client import Client, Job
    from orchestrator.local import LocalStack
    from orchestrator.settings import Settings

app = typer.Typer(help="Chorus: durable LLM agent runs on Celery.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
token_app = typer.Typer(
    help="Bearer tokens of the HTTP API (`chorus server`).", no_args_is_help=True
)
app.add_typer(token_app, name="token")
# Never wrap (piped output keeps its lines) and never read markup or
# highlight in what is printed: model text is shown verbatim. Styles are
# given as Text spans, not markup.
console = Console(soft_wrap=True, highlight=False, markup=False)
errors = Console(stderr=True, soft_wrap=True, highlight=False, markup=False)

#: Exit status of a user mistake (unknown agent, bad JSON, missing job, ...).
USAGE_ERROR = 2
#: Exit status when Redis or Postgres does not answer.
UNREACHABLE = 1

#: The example ``chorus local`` runs when given no agent.
EXAMPLE_MODULE = "examples.parallel_tools"
EXAMPLE_AGENT = "trip-planner"
EXAMPLE_INPUT = "Plan me three nights in Lisbon under 250 EUR for the flight, and book it."
#: ``chorus local --example NAME``: (module, agent, input) of each bundled example.
EXAMPLES = {
    "trip": (EXAMPLE_MODULE, EXAMPLE_AGENT, EXAMPLE_INPUT),
    "pipeline": (
        "examples.pipeline",
        "pipeline-planner",
        "Write slugify(title) for blog post URLs.\n"
        "- lowercase the title\n- join the words with hyphens\n",
    ),
}


def _settings(**overrides: object) -> Settings:
    from orchestrator.settings import load_settings

    if os.getcwd() not in sys.path:  # modules named in CHORUS_MODULES, like celery -A
        sys.path.insert(0, os.getcwd())
    return load_settings(**overrides)


def _client(settings: Settings | None = None) -> Client:
    """A client; whatever the modules in CHORUS_MODULES print while they are
    imported (litellm prints notices) goes to stderr, so stdout carries only
    the command's output (``chorus events`` stays JSON Lines)."""
    from orchestrator.client import Client

    with contextlib.redirect_stdout(sys.stderr):
        return Client(settings or _settings())


def _reader() -> Client:
    """A client for commands that read or answer stored work (status,
    events, cancel, approvals): it imports none of CHORUS_MODULES, whose
    agents and tools (and litellm, which they load) it never uses, so these
    commands start in about a second. What the library logs below an
    error (a live publish that failed, say) is not printed: the command's
    own last line says how it went, and an error is one line, without its
    traceback."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(_OneLine())
        handler.setLevel(logging.ERROR)
        root.addHandler(handler)
    return _client(_settings(modules=[]))


class _OneLine(logging.Formatter):
    """``chorus: <message>``, the first line of it, no traceback."""

    def format(self, record: logging.LogRecord) -> str:
        lines = record.getMessage().splitlines()
        return f"chorus: {lines[0] if lines else ''}"


#: Threads of a worker that takes `tools`: a parallel batch of tools that
#: wait on I/O runs at once, whatever the core count.
TOOLS_THREADS = 32


def _default_pool(queues: list[str]) -> tuple[str, int]:
    if "llm" in queues:
        return "threads", 100
    if "tools" in queues:
        return "threads", TOOLS_THREADS
    return "threads", 16


def _supervise(argv: list[str], processes: int, name: str | None) -> int:
    """Run ``chorus worker ARGV`` (no -n) in PROCESSES processes, nodes NAME-i@HOST."""
    from orchestrator.logs import setup_logging
    from orchestrator.supervisor import Supervisor, process_node

    settings = _settings()
    setup_logging(settings.log_level, settings.log_format)
    command = [sys.executable, "-m", "orchestrator.cli", "worker", *argv]
    supervisor = Supervisor(lambda i: [*command, "-n", process_node(name, i)], processes)
    return supervisor.run()


@app.command()
def worker(
    queues: Annotated[str, typer.Option("--queues", "-Q", help="Comma-separated.")] = "llm,control",
    pool: Annotated[
        str | None, typer.Option("--pool", "-P", help="prefork|threads|gevent|solo")
    ] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c")] = None,
    name: Annotated[str | None, typer.Option("--name", "-n", help="Node name.")] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    processes: Annotated[
        str,
        typer.Option(
            "--processes",
            help="Worker processes: 'auto' (one a core) or N; nodes NAME-1@HOST, ...",
        ),
    ] = "1",
    mingle: Annotated[
        bool,
        typer.Option(
            "--mingle/--without-mingle",
            help="At start, ask the other workers for the ids of revoked tasks (Celery's mingle).",
        ),
    ] = True,
) -> None:
    """Run a Celery worker for Chorus queues.

    Defaults: a threads pool, with 100 slots for `llm`, 32 for `tools` (a
    parallel batch of I/O-bound tools runs at once; `-P prefork` for
    CPU-bound tools) and 16 otherwise. One threads process uses one core:
    `--processes auto` runs one a core under a supervisor that forwards
    signals and restarts a child that dies.
    """
    from orchestrator.supervisor import die_with_supervisor, parse_processes

    names = [q.strip() for q in queues.split(",") if q.strip()]
    default_pool, default_concurrency = _default_pool(names)
    pool = pool or default_pool
    count = parse_processes(processes)
    if count > 1 and pool == "prefork":
        from orchestrator.errors import InvalidRequestError

        raise InvalidRequestError(
            "--processes is for threads or gevent pools: prefork already runs -c processes",
            ["processes"],
        )
    argv = ["-Q", ",".join(names), "-P", pool, "-c", str(concurrency or default_concurrency)]
    argv += ["-l", loglevel, *([] if mingle else ["--without-mingle"])]
    if count > 1:
        raise typer.Exit(_supervise(argv, count, name))
    gc.disable()  # until the worker is set up (workers.app.startup_done)
    from workers.app import create_app

    die_with_supervisor()
    app = create_app(_settings())
    raise typer.Exit(_run_celery(app, ["worker", *argv, "-E", *(["-n", name] if name else [])]))


def _run_celery(app: Any, argv: list[str]) -> int:
    """Run a ``celery`` command on ``app``; its exit status. Celery's own
    ``worker_main``/``start`` lose it (click returns it rather than raising
    in non-standalone mode), so an "Unrecoverable error" exited 0, which a
    supervisor or a restart policy reads as a clean stop."""
    from celery.bin.celery import celery

    celery.params[0].default = app
    try:
        code = celery.main(args=argv, standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    finally:
        celery.params[0].default = None
    return code if isinstance(code, int) else 0


@app.command()
def beat(loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO") -> None:
    """Run Celery beat: the periodic sweeper that re-dispatches stalled turns."""
    gc.disable()  # until beat starts (workers.app.startup_done)
    from orchestrator.settings import private_dir
    from workers.app import create_app

    settings = _settings()
    private_dir(settings.state_dir)
    schedule = str(settings.state_dir / "celerybeat-schedule")
    create_app(settings).start(["beat", "-l", loglevel, "-s", schedule])


@app.command()
def ping(
    node: Annotated[str, typer.Option("--node", "-n", help="The worker's node name.")],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the reply.")] = 5.0,
) -> None:
    """Exit 0 if the worker NODE answers a Celery ping (a liveness probe).

    A worker run with `--processes` answers through any of its processes
    (nodes NAME-1@HOST, NAME-2@HOST, ...; the supervisor restarts a dead
    one). Goes through the Chorus broker settings (key prefix included),
    which a bare `celery inspect ping` would not.
    """
    from orchestrator.celery_conf import make_celery
    from orchestrator.supervisor import node_pattern

    celery = make_celery(_settings(), main="chorus-ping")
    try:
        replies = celery.control.ping(
            timeout=timeout, limit=1, pattern=node_pattern(node), matcher="pcre"
        )
    finally:
        celery.close()
    if not replies:
        errors.print(f"no reply from {node} within {timeout:g}s", style="red")
        raise typer.Exit(1)
    console.print(f"{node}: pong")


@app.command()
def alive(
    node: Annotated[str, typer.Option("--node", "-n", help="The node name, or 'beat'.")],
    max_age: Annotated[
        float, typer.Option(help="Seconds since the process last showed it runs.")
    ] = 60.0,
) -> None:
    """Exit 0 if the worker NODE (or `beat`) runs on this host: its liveness
    file in CHORUS_STATE_DIR was touched within MAX_AGE seconds. Needs no
    Redis, so an outage does not restart the fleet (`chorus ping` says
    whether it is reachable: a readiness probe)."""
    from orchestrator.liveness import age
    from orchestrator.supervisor import node_pattern

    seconds = age(_settings().state_dir, node_pattern(node))
    if seconds is None or seconds > max_age:
        last = "never" if seconds is None else f"{seconds:.0f}s ago"
        errors.print(f"{node}: not alive (last sign {last}, limit {max_age:g}s)", style="red")
        raise typer.Exit(1)
    console.print(f"{node}: alive ({seconds:.0f}s ago)")


@app.command()
def metrics(
    port: Annotated[int, typer.Option(help="Port of the /metrics endpoint.")] = 9108,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "0.0.0.0",
) -> None:
    """Serve Prometheus metrics: turns, tool and model calls, latencies,
    tokens, cost (from the events in Postgres) and queue depths (Redis)."""
    from orchestrator import registry
    from orchestrator.metrics import serve
    from orchestrator.runtime import Runtime

    settings = _settings()
    registry.load_modules(settings.modules)  # tools may name their own queues
    console.print(f"metrics on http://{host}:{port}/metrics")
    serve(Runtime(settings), host, port)


@app.command()
def queues() -> None:
    """Each broker queue: messages waiting and workers reading it. A queue
    with messages and no reader is flagged: its tasks wait for good (the
    sweeper fails their turns after CHORUS_MAX_REDISPATCHES sweeps)."""
    from orchestrator import registry
    from orchestrator.readers import known_queues, queue_states
    from orchestrator.runtime import Runtime

    settings = _settings()
    registry.load_modules(settings.modules)  # tools may name their own queues
    for state in queue_states(Runtime(settings), known_queues()):
        line = f"{state.queue:<20} waiting={state.waiting:<8} readers={state.readers}"
        if state.readers == 0 and state.waiting:
            console.print(Text.assemble(line, ("  no worker reads this queue", "red")))
        else:
            console.print(line)


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply the migrations to CHORUS_DATABASE_URL (or the embedded SQLite file)."""
    from orchestrator.store.migrate import upgrade

    settings = _settings()
    upgrade(settings.db_url, revision)
    console.print(f"database at {_where(settings.db_url)} is at {revision}")


def _where(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _follow(job: Job) -> None:
    from schemas import EventName

    streaming = False
    for event in job.events():
        if event.name is EventName.ASSISTANT_DELTA:
            console.print(event.data.get("text", ""), end="", style="dim")
            streaming = True
            continue
        if streaming:
            console.print()
            streaming = False
        detail = {
            k: v
            for k, v in event.data.items()
            if k in ("tool", "status", "error", "seconds", "queues")
        }
        console.print(
            Text.assemble(
                (f"{event.seq:>4}", "cyan"),
                f" {event.time:%H:%M:%S.%f}"[:-3] + " ",
                (f"{event.name.value:<18}", "bold"),
                f" step={event.step} {detail or ''}",
            )
        )


def _report(job: Job) -> bool:
    """Print the job's outcome; True when it completed."""
    status = job.status()
    completed = status.status.value == "completed"
    console.print()
    console.print(
        Text.assemble(
            (status.status.value, "green" if completed else "red"),
            f" job {job.id} after {status.step} steps",
        )
    )
    for label, usage in (("turn", status.usage), ("tree", status.tree_usage)):
        console.print(
            f"{label} usage: {usage.input_tokens} in + {usage.output_tokens} out tokens, "
            f"{usage.cost_usd:.6f} USD"
        )
    if status.output:
        console.print(Text.assemble(("answer:", "bold"), " ", status.output))
    if status.error:
        console.print(Text.assemble(("error:", "red"), " ", status.error))
    return completed


def _context_data(value: str | None) -> dict[str, Any] | None:
    from orchestrator.errors import InvalidRequestError

    if value is None:
        return None
    try:
        data = json.loads(value)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past Python's stack
        raise InvalidRequestError(f"--context-data is not JSON: {exc}", ["context_data"]) from None
    if not isinstance(data, dict):
        raise InvalidRequestError("--context-data must be a JSON object", ["context_data"])
    return data


@app.command()
def submit(
    agent: str,
    text: str,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="Stream events.")] = False,
    conversation: Annotated[str | None, typer.Option("--conversation", help="Continue it.")] = None,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key")] = None,
    context_data: Annotated[
        str | None, typer.Option("--context-data", help="The job's context_data, a JSON object.")
    ] = None,
    priority: Annotated[
        int, typer.Option("--priority", help="0 to 9, higher first (default 5).")
    ] = DEFAULT_PRIORITY,
) -> None:
    """Submit a job to the fleet; with --follow, stream its events and answer
    (exit status 1 when the job does not complete)."""
    data = _context_data(context_data)
    client = _client()
    job = client.submit(
        agent,
        text,
        conversation_id=conversation,
        idempotency_key=idempotency_key,
        context_data=data,
        priority=priority,
    )
    console.print(f"job {job.id} conversation {job.conversation_id}")
    if follow:
        _follow(job)
        if not _report(job):
            raise typer.Exit(1)


@app.command()
def status(job_id: str) -> None:
    """Print a job's status, usage and answer."""
    _report(_reader().job(job_id))


@app.command()
def events(
    job_id: str,
    since: Annotated[int, typer.Option(help="Resume after this sequence number.")] = 0,
) -> None:
    """Print a job's events as JSON Lines, one object a line (stored, then
    live until the turn ends)."""
    job = _reader().job(job_id)
    for event in job.events(since=since, deltas=False):
        sys.stdout.write(event.model_dump_json() + "\n")
        sys.stdout.flush()


@app.command("cancel")
def cancel_job(job_id: str) -> None:
    """Cancel a job and every subagent under it (safe on a finished job)."""
    client = _reader()
    client.cancel(job_id)
    _report(client.job(job_id))


@app.command()
def send(
    conversation: str,
    text: str,
    context_data: Annotated[
        str | None, typer.Option("--context-data", help="A JSON object; default: the last job's.")
    ] = None,
    priority: Annotated[
        int | None, typer.Option("--priority", help="0 to 9; default: the last job's.")
    ] = None,
) -> None:
    """Send a message to a conversation: runs now if idle, else queued. Its
    turn runs with the last job's context data, budget and priority unless
    given."""
    data = _context_data(context_data)
    client = _client()
    entry = client.send(conversation, text, context_data=data, priority=priority)
    job = client.job_for_message(conversation, entry)
    console.print(f"message {entry}: " + (f"job {job.id}" if job else "queued"))


@app.command("approvals")
def list_approvals(
    conversation: Annotated[
        str | None, typer.Option("--conversation", help="A conversation or the root of a tree.")
    ] = None,
    agent: Annotated[str | None, typer.Option("--agent")] = None,
    tool_name: Annotated[str | None, typer.Option("--tool")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
) -> None:
    """List the tool calls waiting for a person's answer, oldest first."""
    waiting = _reader().pending_approvals(conversation_id=conversation, agent=agent, tool=tool_name)
    for p in waiting:
        if as_json:
            sys.stdout.write(p.model_dump_json() + "\n")
            continue
        deadline = f" deadline {p.deadline:%Y-%m-%d %H:%M:%S}" if p.deadline else ""
        console.print(
            f"{p.call_id}  {p.tool}  agent {p.agent}  job {p.job_id}  "
            f"since {p.requested_at:%Y-%m-%d %H:%M:%S}{deadline}  "
            + json.dumps(p.arguments, ensure_ascii=False)
        )
    if not waiting and not as_json:
        console.print("no tool call is waiting for approval", style="dim")


@app.command()
def approve(
    call_id: str,
    note: Annotated[str | None, typer.Option("--note", help="Kept with the answer.")] = None,
    by: Annotated[str | None, typer.Option("--by", help="Who answers (default: $USER).")] = None,
) -> None:
    """Approve a tool call waiting for an answer: it runs and its turn goes on."""
    _answered("approved", call_id, _reader().approve(call_id, note=note, by=by))


@app.command()
def deny(
    call_id: str,
    reason: Annotated[str, typer.Option("--reason", help="What the model is told.")],
    by: Annotated[str | None, typer.Option("--by", help="Who answers (default: $USER).")] = None,
) -> None:
    """Deny a tool call waiting for an answer: the model gets an error with the reason."""
    _answered("denied", call_id, _reader().deny(call_id, reason=reason, by=by))


def _answered(decision: str, call_id: str, sent: bool) -> None:
    """The answer's line. An answer is stored in Postgres before anything
    goes to Redis: if Redis then did not take its call, the one line says the
    answer stands (the sweeper sends what it moves on), so that it is not
    given again, and the exit status is 1."""
    if sent:
        console.print(f"{decision} {call_id}")
        return
    errors.print(
        f"chorus: {decision} {call_id} (stored), but Redis does not answer; "
        "the sweeper sends it on once Redis answers"
    )
    sys.exit(UNREACHABLE)


@app.command()
def server(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    keepalive: Annotated[
        float, typer.Option(help="Seconds without an event before an SSE keep-alive comment.")
    ] = 15.0,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "info",
) -> None:
    """Serve the HTTP API (/v1, /openapi.json) with uvicorn. Requests carry
    a bearer token from `chorus token create`."""
    import uvicorn

    from orchestrator.server.app import create_app

    application = create_app(_settings(), keepalive=keepalive)
    uvicorn.run(
        application,
        host=host,
        port=port,
        log_level=loglevel.lower(),
        log_config=_redacted_log_config(uvicorn.config.LOGGING_CONFIG),
    )


def _redacted_log_config(config: dict[str, Any]) -> dict[str, Any]:
    """uvicorn's logging, every handler redacting credentials (a token a
    client put in a URL's query would be in the access log)."""
    redacting = {"redact": {"()": "orchestrator.logs.RedactingFilter"}}
    handlers = {
        name: {**handler, "filters": [*handler.get("filters", []), "redact"]}
        for name, handler in config["handlers"].items()
    }
    return {**config, "filters": {**config.get("filters", {}), **redacting}, "handlers": handlers}


_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@token_app.command("create")
def token_create(
    tenant: Annotated[str, typer.Option(help="The tenant its jobs belong to.")],
    scope: Annotated[str, typer.Option(help="read, submit (and read) or admin (every tenant).")],
    name: Annotated[str | None, typer.Option(help="A label (who or what uses it).")] = None,
) -> None:
    """Create a token and print it, once: only its hash is stored."""
    _new_token(_settings(), tenant, scope, name)


def _new_token(settings: Settings, tenant: str, scope: str, name: str | None) -> str:
    """Create a token and print it, once (a line about it on stderr, the
    token alone on stdout); its prefix, which revokes it."""
    from orchestrator.errors import InvalidRequestError
    from orchestrator.runtime import Runtime
    from orchestrator.store import token_sql

    if not _TENANT.fullmatch(tenant):
        raise InvalidRequestError(
            "--tenant: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            ["tenant"],
        )
    if scope not in {s.value for s in token_sql.Scope}:
        raise InvalidRequestError("--scope: read, submit or admin", ["scope"])
    if name is not None and not 0 < len(name) <= 200:
        raise InvalidRequestError("--name: 1 to 200 characters", ["name"])
    with Runtime(settings).session() as session:
        row, token = token_sql.create(session, tenant, token_sql.Scope(scope), name)
        prefix = row.prefix
    errors.print(f"token {prefix} ({scope}, tenant {tenant}); shown once, keep it:")
    console.print(token)
    return prefix


@token_app.command("list")
def token_list() -> None:
    """Every token: id, prefix, scope, tenant, name, created, revoked (never the token)."""
    from orchestrator.runtime import Runtime
    from orchestrator.store import token_sql

    with Runtime(_settings()).session() as session:
        rows = token_sql.listed(session)
    for row in rows:
        revoked = f"revoked {row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "active"
        console.print(
            f"{row.id}  {row.prefix}  {row.scope:<6}  {row.tenant}  {row.name or '-'}  "
            f"{row.created_at:%Y-%m-%d %H:%M}  {revoked}"
        )


@token_app.command("revoke")
def token_revoke(token: Annotated[str, typer.Argument(help="Its prefix or id.")]) -> None:
    """Revoke a token: requests with it answer 401 from now on, and the event
    streams it has open end within 5 s."""
    from orchestrator.errors import InvalidRequestError
    from orchestrator.runtime import Runtime
    from orchestrator.store import token_sql
    from orchestrator.store.values import check

    check(token, "token")
    with Runtime(_settings()).session() as session:
        revoked = token_sql.revoke(session, token)
    if not revoked:
        raise InvalidRequestError(f"no active token {token[:64]!r}", ["token"])
    console.print(f"revoked {token}")


@app.command()
def local(
    agent: Annotated[
        str | None, typer.Argument(help="A registered agent (default: the example's).")
    ] = None,
    text: Annotated[str | None, typer.Argument(help="The input (default: the example's).")] = None,
    module: Annotated[
        list[str] | None, typer.Option("--module", "-m", help="Module declaring agents/tools.")
    ] = None,
    example: Annotated[
        str, typer.Option("--example", "-e", help=f"Bundled example: {', '.join(EXAMPLES)}.")
    ] = "trip",
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="Then keep the stack up and serve the HTTP API and the dashboard on "
            "127.0.0.1 until Ctrl-C, with a token for this run.",
        ),
    ] = False,
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="The port of --serve (default 8000; 0: any free one)."),
    ] = None,
) -> None:
    """Run one job on the embedded default: no Redis or Postgres needed.

    Starts the bundled redis-server, a SQLite file and one worker process a
    core (their logs in STATE_DIR/workers.log), then runs an example (the
    trip-planning agent unless --example names another) or AGENT, and
    follows it. With --serve, the dashboard shows it as it runs, and then
    (with every job of the state directory) until Ctrl-C or SIGTERM stops
    everything.
    """
    from orchestrator.errors import InvalidRequestError
    from orchestrator.local import SERVE_PORT, dashboard_url, local_stack, serving_socket
    from orchestrator.logs import redact

    if example not in EXAMPLES:
        raise InvalidRequestError(
            f"--example: no example {example!r}; there are {', '.join(EXAMPLES)}", ["example"]
        )
    if port is not None and not serve:
        raise InvalidRequestError("--port is the port of --serve: add --serve", ["port"])
    example_module, example_agent, example_input = EXAMPLES[example]
    settings = _settings()
    modules = list(module or settings.modules)
    if agent is None or not modules:  # an example runs with its own module loaded
        modules = list(dict.fromkeys([*modules, example_module]))
    agent, text = agent or example_agent, text or example_input
    settings = settings.model_copy(update={"modules": modules})
    with contextlib.ExitStack() as resources:
        # the port first: one in use is refused before anything starts
        listener = None
        if serve:
            listener = resources.enter_context(serving_socket(SERVE_PORT if port is None else port))
        stack = resources.enter_context(local_stack(settings))
        running = stack.settings
        # the embedded Redis's URL carries its password: shown masked
        shown = redact(running.redis_url or "")
        console.print(f"redis: {shown} (embedded: {settings.embedded})", style="dim")
        console.print(f"state: {_where(running.db_url)}", style="dim")
        until_stopped = None
        # up while the job runs: a call waiting for a person can be answered
        if listener is not None:
            until_stopped = resources.enter_context(_serving_local(stack, listener))
        client = _client(running)
        job = client.submit(agent, text)
        stack.start_other_workers()
        console.print(f"job {job.id} conversation {job.conversation_id}")
        if listener is not None:
            url = dashboard_url(listener.getsockname()[1], job.id)
            console.print(Text.assemble(("dashboard:", "bold"), f" {url}"))
            console.print("log in with the token above (revoked when this stops)", style="dim")
        _follow(job)
        _report(job)
        client.close()
        if running.db_url.startswith("sqlite"):
            console.print(
                f"inspect it: sqlite3 {running.db_url.removeprefix('sqlite:///')}", style="dim"
            )
        if until_stopped is None:
            console.print(
                f"see it on the dashboard: rerun with --serve, then open "
                f"{dashboard_url(SERVE_PORT, job.id)}",
                style="dim",
            )
            return
        console.print(f"{SERVING}: Ctrl-C stops the server and the stack", style="dim")
        until_stopped()
        if stack.workers_failed:
            raise typer.Exit(1)


#: What ``chorus local --serve`` prints once its job ended and it serves on.
SERVING = "serving on"
#: The tenant and name of the token ``chorus local --serve`` creates.
LOCAL_TENANT = "local"
LOCAL_TOKEN_NAME = "chorus local --serve"


@contextlib.contextmanager
def _serving_local(stack: LocalStack, listener: socket.socket) -> Iterator[Callable[[], None]]:
    """Serve the HTTP API and the dashboard on LISTENER while the block
    runs (its job can be watched, and its calls approved, as it runs), with
    an admin token (jobs submitted by the Python client, as this one, have
    no tenant: only an admin token sees them) printed once and revoked when
    the server stops (or, if this process was killed, by the next one
    serving the state directory's store alone). Yields ``until_stopped``
    (:func:`orchestrator.local.serving`)."""
    from orchestrator.local import serving, serving_lock
    from orchestrator.runtime import Runtime
    from orchestrator.store import token_sql

    settings = stack.settings

    def revoke_stale() -> None:
        # only in the state directory's own store, which the lock covers
        if settings.database_url is None:
            with Runtime(settings).session() as session:
                token_sql.revoke_named(session, LOCAL_TENANT, LOCAL_TOKEN_NAME)

    with serving_lock(settings.state_dir, revoke_stale):
        prefix = _new_token(settings, LOCAL_TENANT, "admin", LOCAL_TOKEN_NAME)
        try:
            with serving(settings, listener) as until_stopped:
                yield until_stopped
        finally:
            with Runtime(settings).session() as session:
                token_sql.revoke(session, prefix)


#: Postgres's codes for an undefined table and an undefined column.
_UNDEFINED = frozenset({"42P01", "42703"})


def _unmigrated(exc: Any) -> bool:
    """Whether a database error says a table or column is missing."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in _UNDEFINED:
        return True
    return str(orig).startswith(("no such table", "no such column"))  # SQLite


def _unreachable(exc: BaseException) -> str | None:
    """One line naming the service that did not answer, if EXC says so
    (checked only against modules already loaded: `--help` loads neither)."""
    redis_errors = sys.modules.get("redis.exceptions")
    if redis_errors is not None and isinstance(exc, redis_errors.ConnectionError):
        return f"Redis does not answer: {exc}"
    kombu_errors = sys.modules.get("kombu.exceptions")  # a task sent to the broker
    if kombu_errors is not None and isinstance(exc, kombu_errors.OperationalError):
        return f"Redis does not answer: {exc}"
    sql_errors = sys.modules.get("sqlalchemy.exc")
    if sql_errors is not None and isinstance(exc, sql_errors.DBAPIError) and _unmigrated(exc):
        return "the database has no Chorus tables, or older ones: run `chorus db upgrade`"
    if sql_errors is not None and isinstance(exc, sql_errors.OperationalError):
        first = str(exc.orig).strip().splitlines()[0] if exc.orig else "no connection"
        return f"Postgres does not answer: {first}"
    return None


def main() -> None:
    """The ``chorus`` entry point: a user mistake is one line on stderr and
    exit status 2, never a traceback."""
    try:
        app()
    except UserError as exc:
        errors.print(f"chorus: {exc}")
        sys.exit(USAGE_ERROR)
    except Exception as exc:
        down = _unreachable(exc)
        if down is None:
            raise
        errors.print(f"chorus: {down}")
        sys.exit(UNREACHABLE)
    finally:
        # The interpreter's teardown runs collections over the whole heap
        # (after litellm is imported, seconds of CPU); frozen objects are
        # left to the exit.
        gc.freeze()


if __name__ == "__main__":
    main()
