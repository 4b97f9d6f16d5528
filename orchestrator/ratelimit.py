"""Distributed rate limits on model calls: sliding windows in Redis.

Each limit keeps a sorted set of admitted calls (score: time). Admission is
one Lua script, so every worker shares the window atomically: a call is
admitted if the window holds fewer than ``requests`` calls and fewer than
``tokens`` prompt tokens; otherwise the script answers how long until the
oldest entry leaves the window, and the step is sent again with that
countdown (deferred, never dropped, never spinning in a worker slot).

A call is admitted once its request is built and the model client loaded,
just before it is sent, and it counts in its window for the limit's period
plus an allowance for the time it may still take to reach the provider
(``CHORUS_RATE_LIMIT_ALLOWANCE``): the provider's window never holds more
than the limit. Tokens are those of the whole request (:func:`request_tokens`).

A step's call deferred by the limits leaves a mark in Redis with the time
of its first deferral; its admission deletes it and tells how long the call
was held, which ``llm.requested`` records (``rate_limited_seconds``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import redis

from schemas import RateLimit

log = logging.getLogger(__name__)

# KEYS: one sorted set per limit, then the call's hold mark if ARGV's last
# is a time to live above 0. ARGV: (period, max_requests, max_tokens,
# tokens) per limit key (0 = no limit), then an id, then that time to live.
# Time is Redis's own clock, read inside the script, so every worker's
# entries share one clock and are stamped in the order they are admitted.
# Members are "<id>:r:<tokens>" for an admitted call, "<id>:t:<tokens>" for
# tokens counted after it (its output). The hold mark holds when the call
# was first deferred: a deferral sets it (if unset), the admission reads
# and deletes it, and answers how long the call was held.
_ADMIT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local mark_ttl = tonumber(ARGV[#ARGV])
local limits = #KEYS
if mark_ttl > 0 then limits = limits - 1 end
local wait = 0
for i = 1, limits do
  local key = KEYS[i]
  local base = (i - 1) * 4
  local period = tonumber(ARGV[base + 1])
  local max_requests = tonumber(ARGV[base + 2])
  local max_tokens = tonumber(ARGV[base + 3])
  local tokens = tonumber(ARGV[base + 4])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - period)
  local entries = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local count, used = 0, 0
  for j = 1, #entries, 2 do
    local kind, n = string.match(entries[j], ':(%a):(%d+)$')
    if kind == 'r' then count = count + 1 end
    used = used + tonumber(n)
  end
  local full = (max_requests > 0 and count >= max_requests)
    or (max_tokens > 0 and count > 0 and used + tokens > max_tokens)
  if full then
    local until_free = tonumber(entries[2]) + period - now
    if until_free > wait then wait = until_free end
  end
end
if wait > 0 then
  if mark_ttl > 0 then
    redis.call('SET', KEYS[#KEYS], string.format('%.6f', now), 'NX')
    redis.call('PEXPIRE', KEYS[#KEYS], math.ceil((wait + mark_ttl) * 1000))
  end
  return string.format('%.6f %.6f 0', wait, now)
end
for i = 1, limits do
  local base = (i - 1) * 4
  redis.call('ZADD', KEYS[i], now, ARGV[#ARGV - 1] .. ':r:' .. ARGV[base + 4])
  redis.call('PEXPIRE', KEYS[i], math.ceil(tonumber(ARGV[base + 1]) * 1000) + 1000)
end
local held = 0
if mark_ttl > 0 then
  local since = redis.call('GET', KEYS[#KEYS])
  if since then
    held = now - tonumber(since)
    redis.call('DEL', KEYS[#KEYS])
  end
end
return string.format('0 %.6f %.6f', now, held)
"""

#: How long a call's hold mark outlives the deferral that set it: the
#: step sent again with its countdown may wait that much longer for a
#: worker (a busy queue, a sweep) and still be told how long it was held.
HOLD_MARK_SECONDS = 3600.0


class Admission(NamedTuple):
    """What :func:`admit` answered."""

    #: Seconds to wait before asking again (0: admitted).
    wait: float
    #: Redis's time of the answer.
    now: float
    #: Admitted: seconds since the call's first deferral (its hold mark),
    #: 0 if it was never deferred (or no mark was asked for).
    held: float = 0.0


class RateLimited(Exception):
    """A model call the rate limits do not admit yet: try after ``wait`` seconds."""

    def __init__(self, wait: float) -> None:
        super().__init__(f"over a rate limit for {wait:.3f} s")
        self.wait = wait


class _Missing(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def limit_key(prefix: str, limit: RateLimit, model: str, context: Mapping[str, Any]) -> str:
    name = limit.key.format_map(_Missing(context)) if limit.key else model
    return f"{prefix}:rate:{name}"


def admit(
    client: redis.Redis,
    prefix: str,
    limits: Sequence[RateLimit],
    model: str,
    context: Mapping[str, Any],
    prompt_tokens: int,
    allowance: float = 0.0,
    mark: str | None = None,
) -> Admission:
    """Admit one call under every limit, or say how long to wait.

    ``allowance``: how long after admission the call may reach the provider
    (the rest of the step, the model client's own work, a busy process).
    Each call counts in its window that much longer than the limit's
    period: calls admitted a period apart can reach the provider closer
    together than that, in a window the provider counts.

    ``mark``: the call's hold mark (:func:`orchestrator.keys.rate_hold`),
    set at its first deferral, so that its admission, in another task,
    answers how long the limits held it (in the same script: no round
    trip more).

    Returns the :class:`Admission`: ``wait`` 0 when admitted (and counted)
    at ``now``, Redis's time.
    """
    if not limits:
        return Admission(0.0, time.time())
    keys = [limit_key(prefix, lim, model, context) for lim in limits]
    args: list[Any] = []
    for lim in limits:
        counted = prompt_tokens if lim.count in ("input", "total") else 0
        args += [repr(lim.period + allowance), lim.requests or 0, lim.tokens or 0, counted]
    args.append(uuid.uuid4().hex)
    if mark is not None:
        keys.append(mark)
    args.append(repr(HOLD_MARK_SECONDS) if mark is not None else "0")
    wait, now, held = str(client.eval(_ADMIT, len(keys), *keys, *args)).split()
    return Admission(float(wait), float(now), float(held))


def record_output(
    client: redis.Redis,
    prefix: str,
    limits: Sequence[RateLimit],
    model: str,
    context: Mapping[str, Any],
    output_tokens: int,
    allowance: float = 0.0,
) -> None:
    """Count a finished call's output tokens in the windows that count them."""
    counting = [lim for lim in limits if lim.tokens and lim.count in ("output", "total")]
    if not counting or output_tokens <= 0:
        return
    seconds, micros = client.time()  # the clock the admission script uses
    now = seconds + micros / 1_000_000
    pipe = client.pipeline(transaction=False)
    for lim in counting:
        key = limit_key(prefix, lim, model, context)
        pipe.zadd(key, {f"{uuid.uuid4().hex}:t:{output_tokens}": now})
        pipe.pexpire(key, int((lim.period + allowance) * 1000) + 1000)
    try:
        pipe.execute()
    except redis.RedisError:  # the call is done; a lost count only loosens the limit
        log.warning("could not count %d output tokens", output_tokens, exc_info=True)


def request_tokens(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] = (),
    messages_chars: int | None = None,
) -> int:
    """The size of a model request in tokens: everything that is sent.

    Every message as sent (system, user text, assistant text and each tool
    call's name and arguments, tool results) and the schemas of the tools
    offered, estimated at four characters of their JSON a token. One count
    serves the context-token limit (checkpoints) and token rate limits.
    ``messages_chars``: the length of the messages' compact JSON when the
    caller knows it (a step sums sizes it cached: :mod:`orchestrator.engine.history`),
    so an unchanged history is not serialized again.

    Why an estimate and not ``litellm.token_counter``: measured on a
    280 kB tool-heavy history, ``token_counter`` took ~25 ms (tiktoken over
    every message, on every step, growing with the history) where
    ``json.dumps`` took ~1.5 ms; for models without a local tokenizer
    litellm falls back to OpenAI's anyway, or fetches one over the network.
    The JSON's quotes and keys make the estimate err high for English text
    (a little above cl100k's count), the safe side for both limits; text
    outside ASCII is escaped (``\\uXXXX``), so CJK text counts 1.5 tokens a
    character instead of a quarter.
    """
    sent = json_chars(list(messages)) if messages_chars is None else messages_chars
    if tools:
        sent += json_chars(list(tools))
    return max(1, sent // 4)


def json_chars(value: Any) -> int:
    """Characters of ``value``'s compact JSON, as :func:`request_tokens` counts them."""
    return len(json.dumps(value, separators=(",", ":"), default=str))
