"""The runtime a process shares: settings, database sessions, Redis."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Session

from orchestrator.errors import ConfigurationError
from orchestrator.events import Outbox, publish_live
from orchestrator.lazy import made_once
from orchestrator.llm.client import LiteLLMClient, ModelClient
from orchestrator.settings import Settings
from orchestrator.store.db import Db, Pool, autocommit_scope, session_scope
from orchestrator.store.dialect import write_scope
from schemas import Event


class Runtime:
    """Connections built lazily, so a prefork parent never holds one.

    ``model`` is the client every model call goes through: by default the
    real one (litellm and the openai SDK); a test passes an in-process one
    (:mod:`orchestrator.testing`).
    """

    def __init__(self, settings: Settings, model: ModelClient | None = None) -> None:
        self.settings = settings
        self.model: ModelClient = model if model is not None else LiteLLMClient()
        #: The engine sessions use; None: the process's pool for the
        #: settings' URL (the async client binds its async driver's here).
        self.engine: Engine | None = None

    @made_once
    def redis(self) -> redis.Redis:
        if self.settings.redis_url is None:
            raise ConfigurationError(
                "CHORUS_REDIS_URL is not set; run `chorus local` for the embedded default"
            )
        return redis.Redis.from_url(self.settings.redis_url, decode_responses=True)

    @made_once
    def pool(self) -> Pool:
        return Pool(self.settings.db_pool_size, self.settings.db_pool_overflow)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with session_scope(self.settings.db_url, pool=self.pool, engine=self.engine) as s:
            yield s

    @contextmanager
    def autocommit(self) -> Iterator[Connection]:
        """A connection whose every statement commits as it runs: for reads
        and single-statement writes, without ``BEGIN``/``COMMIT`` round trips."""
        with autocommit_scope(self.settings.db_url, self.pool, engine=self.engine) as connection:
            yield connection

    @contextmanager
    def guarded_write(self) -> Iterator[Db]:
        """Where a guarded write runs with its events: one statement on its
        own where it can be (:func:`~orchestrator.store.dialect.write_scope`)."""
        with write_scope(self.settings.db_url, self.pool) as db:
            yield db

    @contextmanager
    def transaction(self, outbox: Outbox | None = None) -> Iterator[tuple[Session, Outbox]]:
        """A session and the outbox of its events: the events are stored in
        the same commit and published to Redis after it. ``outbox`` may hold
        events recorded earlier (a claim, an admission) that are stored with
        this transaction."""
        outbox = outbox if outbox is not None else Outbox()
        with session_scope(self.settings.db_url, pool=self.pool, engine=self.engine) as s:
            yield s, outbox
            outbox.flush(s)
        self.publish(outbox)

    def publish(self, outbox: Outbox) -> None:
        settings = self.settings
        outbox.publish(
            self.redis,
            settings.redis_prefix,
            settings.event_stream_maxlen,
            settings.event_stream_ttl,
        )

    def publish_live(self, event: Event) -> None:
        settings = self.settings
        publish_live(
            self.redis,
            settings.redis_prefix,
            settings.event_stream_maxlen,
            settings.event_stream_ttl,
            event,
        )
