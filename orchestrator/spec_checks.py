"""Checks of an agent spec that its schema cannot make: no credentials in
``model_settings``, rate-limit key templates that can only name a
``context_data`` value, an ``output_schema`` that is a valid JSON schema,
and, for an inline spec, nothing that says where a model call goes. Each
failure is a :class:`UserError` naming the field.

A job's submitter chooses the inline spec it runs, so ``model_settings``
must never carry a credential: the worker's environment holds the
provider keys. A registered agent (declared with ``Agent(...)`` in the
workers' modules) is worker-side configuration: it may pass any litellm
argument (``api_base``, ``input_cost_per_token`` ...) except the
credential keys below, at any depth. An inline spec names a model and how
it samples, never where the call goes or as whom: its ``model_settings``
keys must be in :data:`INLINE_SETTINGS`, an endpoint (``api_base``,
``base_url``) must be listed in ``CHORUS_MODEL_ENDPOINTS``, and its model
string may not be a URL nor, without a listed endpoint, a provider whose
default endpoint is on the worker's own host (:func:`check_inline`).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterator
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from orchestrator.errors import InvalidRequestError, SecretInSettingsError, SettingNotAllowedError
from orchestrator.store.values import check
from schemas import AgentSpec, RateLimit

#: Keys that carry a credential (compared lower-cased, ``-`` as ``_``),
#: wherever they appear in ``model_settings``: litellm arguments and the
#: names of HTTP headers that authenticate.
CREDENTIAL_KEYS = frozenset(
    {
        "api_key",
        "apikey",
        "api_token",
        "token",
        "access_token",
        "auth_token",
        "bearer_token",
        "id_token",
        "refresh_token",
        "session_token",
        "password",
        "secret",
        "secret_key",
        "client_secret",
        "private_key",
        "credentials",
        "service_account_json",
        "vertex_credentials",
        "vertex_ai_credentials",
        "azure_ad_token",
        "azure_ad_token_provider",
        "azure_password",
        "azure_client_secret",
        "azure_api_key",
        "authorization",
        "proxy_authorization",
        "x_api_key",
        "api_key_header",
        "x_goog_api_key",
        "ocp_apim_subscription_key",
        "x_auth_token",
        "cookie",
    }
)
#: ``aws_*`` keys that name no secret; every other ``aws_*`` key is refused
#: (keys, session tokens, and roles or profiles that would borrow the
#: worker's own AWS identity).
AWS_ORDINARY = frozenset({"aws_region_name", "aws_bedrock_runtime_endpoint"})


def _is_credential(key: str) -> bool:
    norm = key.strip().lower().replace("-", "_")
    if norm.startswith("aws_"):
        return norm not in AWS_ORDINARY
    return norm in CREDENTIAL_KEYS


def url_has_credentials(value: str) -> bool:
    if "://" not in value:
        return False
    try:
        url = urlsplit(value.strip())
    except ValueError:
        return False
    if url.username or url.password:
        return True
    return any(_is_credential(name) or name.lower() == "key" for name, _ in parse_qsl(url.query))


def _entries(value: Any, path: str) -> Iterator[tuple[str, str, Any]]:
    """(dotted path, key, value) of every dict entry and list item, depth first."""
    if isinstance(value, dict):
        pairs: list[tuple[Any, Any]] = list(value.items())
    elif isinstance(value, list | tuple):
        pairs = list(enumerate(value))
    else:
        return
    for key, item in pairs:
        inner = f"{path}.{key}"
        yield inner, str(key), item
        yield from _entries(item, inner)


def refuse_credentials(model_settings: dict[str, Any]) -> None:
    """Raise :class:`SecretInSettingsError` naming the first credential found."""
    for path, key, value in _entries(model_settings, "model_settings"):
        if _is_credential(key):
            raise SecretInSettingsError(path, "it is a credential")
        if isinstance(value, str) and url_has_credentials(value):
            raise SecretInSettingsError(path, "the URL carries credentials")


def check_key_template(index: int, limit: RateLimit) -> None:
    """A key template may name ``context_data`` values (``"tenant:{tenant}"``)
    and nothing else: no indexing, attributes, conversions or formats."""
    if limit.key is None:
        return
    field = f"rate_limits.{index}.key"
    try:
        parts = list(string.Formatter().parse(limit.key))
    except ValueError as exc:
        detail = f"{field}: malformed template {limit.key!r}: {exc}"
        raise InvalidRequestError(detail, [field]) from None
    for _text, name, spec, conversion in parts:
        if name is None:
            continue
        if not name or name.isdigit() or any(c in name for c in ".[]") or spec or conversion:
            raise InvalidRequestError(
                f"{field}: {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} in {limit.key!r}: a template may only "
                "name a context_data key, as {tenant}",
                [field],
            )


def check_output_schema(schema: dict[str, Any] | None) -> None:
    """A valid JSON schema (2020-12, as the step validates answers), every
    ``pattern`` compiled by the engine that will match it
    (:mod:`orchestrator.patterns`). A schema that passed is remembered: an
    agent's is checked once, not at every submit."""
    if schema is not None:
        _check_schema(json.dumps(schema, sort_keys=True))


@lru_cache(maxsize=256)
def _check_schema(text: str) -> None:
    # jsonschema (and the patterns engine that patches it) load here, at the
    # first output schema checked: a client or policy that never checks one
    # does not pay their import.
    import jsonschema
    from jsonschema.exceptions import SchemaError

    from orchestrator import patterns

    try:
        with patterns.limited():
            jsonschema.Draft202012Validator.check_schema(json.loads(text))
    except SchemaError as exc:
        path = "".join(f".{p}" for p in exc.absolute_path)
        raise InvalidRequestError(
            f"output_schema{path}: not a valid JSON schema: {exc.message}", ["output_schema"]
        ) from None
    _check_references(json.loads(text))


#: Keywords whose values are data, not schemas (a ``$ref`` there is a value).
_DATA_KEYWORDS = frozenset({"const", "enum", "examples", "default"})


def _references(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) of every ``$ref`` and nested ``$id`` in a schema."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("$ref", "$id") and path:
                yield f"{path}.{key}", item
            elif key == "$ref":
                yield key, item
            if key not in _DATA_KEYWORDS:
                yield from _references(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _references(item, f"{path}.{index}")


def _check_references(schema: Any) -> None:
    """Every ``$ref`` that is a JSON pointer or another document resolves:
    one that does not failed the step at the first answer, after its model
    call was paid. (An anchor, or a schema with a nested ``$id``, which
    moves the base of what is below it, is left to the step.)"""
    import jsonschema_specifications
    import referencing.exceptions
    from referencing.jsonschema import DRAFT202012

    found = list(_references(schema, ""))
    if any(path.endswith("$id") for path, _ in found):
        return
    resolver = jsonschema_specifications.REGISTRY.resolver_with_root(
        DRAFT202012.create_resource(schema)
    )
    for path, ref in found:
        if not isinstance(ref, str) or (
            ref.startswith("#") and not ref.startswith("#/") and ref != "#"
        ):
            continue
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable as exc:
            raise InvalidRequestError(
                f"output_schema.{path}: {ref!r} does not resolve ({type(exc).__name__})",
                ["output_schema"],
            ) from None


def check_spec(spec: AgentSpec) -> None:
    """The checks that need no registry (see the module docstring), and
    that the spec can be stored (:func:`~orchestrator.store.values.check`)."""
    check(spec, "agent")
    refuse_credentials(spec.model_settings)
    for index, limit in enumerate(spec.rate_limits):
        check_key_template(index, limit)
    check_output_schema(spec.output_schema)


#: ``model_settings`` keys an inline spec may carry: how the model samples
#: and what shape its answer takes. Not the endpoint (see
#: :data:`ENDPOINT_SETTINGS`), keys, headers, request bodies, prices,
#: provider, region, project or deployment choices, retries or fallbacks:
#: those are the workers' configuration (a registered agent or their
#: environment).
INLINE_SETTINGS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "n",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "seed",
        "user",
        "response_format",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning_effort",
        "thinking",
        "verbosity",
        "timeout",
        "api_version",
    }
)
#: ``model_settings`` keys that name an endpoint: an inline spec may carry
#: one only when ``CHORUS_MODEL_ENDPOINTS`` lists it.
ENDPOINT_SETTINGS = frozenset({"api_base", "base_url"})
_API_VERSION = re.compile(r"[0-9A-Za-z._-]{1,40}")
#: litellm providers whose default endpoint is a server on the worker's own
#: host (``ollama/x`` posts to ``http://localhost:11434``, ``llamafile/x`` to
#: ``http://127.0.0.1:8080/v1`` ...), or that start an interactive login
#: (``github_copilot``). An inline model of one of them must name a listed
#: endpoint: else a job would choose a request to the workers' loopback.
LOCAL_PROVIDERS = frozenset(
    {
        "a2a",
        "docker_model_runner",
        "github_copilot",
        "langflow",
        "langgraph",
        "lemonade",
        "llamafile",
        "ollama",
        "ollama_chat",
        "vllm",
        "xinference",
    }
)


def endpoint_listed(url: str, endpoints: list[str]) -> bool:
    """True when ``url`` is under an entry of ``endpoints``: the same scheme
    and host, the entry's port if it names one (any port if not), and a
    path that is the entry's or below it. A URL that parsers may read two
    ways (a user part, a backslash, whitespace, ``.`` or ``..`` segments)
    is under none."""
    if not url.isprintable() or any(c in url for c in "@\\ %"):
        return False
    try:
        got = urlsplit(url)
        got_port = got.port
    except ValueError:
        return False
    path = got.path.rstrip("/")
    if got.scheme not in ("http", "https") or not got.hostname or got.query or got.fragment:
        return False
    if any(segment in (".", "..") for segment in path.split("/")):
        return False
    for entry in endpoints:
        want = urlsplit(entry.strip())
        base = want.path.rstrip("/")
        if (
            (got.scheme, got.hostname) == (want.scheme, want.hostname)
            and (want.port is None or got_port == want.port)
            and (path == base or path.startswith(f"{base}/"))
        ):
            return True
    return False


#: The largest inline spec, in characters of its JSON: it is stored with the
#: conversation and its system prompt is sent on every step (a job's input
#: has ``CHORUS_MAX_INPUT_CHARS``; a registered agent is the workers' own).
MAX_INLINE_SPEC_CHARS = 1_000_000


def check_inline(spec: AgentSpec, endpoints: list[str]) -> None:
    """Refuse what an inline spec may not choose (see the module docstring)
    with :class:`SettingNotAllowedError` naming the field, and an inline
    spec over :data:`MAX_INLINE_SPEC_CHARS` with :class:`InvalidRequestError`."""
    size = len(spec.model_dump_json())
    if size > MAX_INLINE_SPEC_CHARS:
        raise InvalidRequestError(
            f"agent: an inline spec may hold at most {MAX_INLINE_SPEC_CHARS:,} characters "
            f"of JSON; this one holds {size:,}",
            ["agent"],
        )
    if "://" in spec.model or any(c.isspace() for c in spec.model):
        raise SettingNotAllowedError("model", "a model string may not hold an address")
    if any(c in spec.model for c in "?#%\\") or {".", ".."} & set(spec.model.split("/")):
        # some providers put the model in the URL's path (Azure's deployments):
        # "azure/../../../admin/x?y=" posted to /admin/x with the workers' key
        raise SettingNotAllowedError(
            "model", "a model string may not hold '?', '#', '%', '\\' or a '.'/'..' segment"
        )
    provider = spec.model.split("/", 1)[0]
    if provider in LOCAL_PROVIDERS and not ENDPOINT_SETTINGS & spec.model_settings.keys():
        raise SettingNotAllowedError(
            "model",
            f"{provider!r} models default to a server on the workers' own host: "
            "name its endpoint (listed in CHORUS_MODEL_ENDPOINTS) as api_base",
        )
    for key, value in spec.model_settings.items():
        path = f"model_settings.{key}"
        if key in ENDPOINT_SETTINGS:
            if not (isinstance(value, str) and endpoint_listed(value, endpoints)):
                raise SettingNotAllowedError(path, "the endpoint is not in CHORUS_MODEL_ENDPOINTS")
        elif key not in INLINE_SETTINGS:
            raise SettingNotAllowedError(
                path, f"an inline spec may only set {sorted(INLINE_SETTINGS)} and a listed endpoint"
            )
        elif key == "api_version" and not (
            isinstance(value, str) and _API_VERSION.fullmatch(value)
        ):  # it goes into the endpoint's query string
            raise SettingNotAllowedError(path, "an API version is letters, digits, '.', '_', '-'")
