"""Checks of an agent spec that its schema cannot make: no credentials in
``model_settings`` and rate-limit key templates that can only name a
``context_data`` value. Each failure is a :class:`UserError` naming the key.

A job's submitter chooses the inline spec it runs, so ``model_settings``
must never carry a credential: the worker's environment holds the
provider keys. Ordinary litellm parameters (``max_tokens``,
``input_cost_per_token``, ``api_base`` ...) pass; the keys below, at any
depth, do not.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from orchestrator.errors import InvalidRequestError, SecretInSettingsError
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


def check_spec(spec: AgentSpec) -> None:
    """The checks that need no registry (see the module docstring), and
    that the spec can be stored (:func:`~orchestrator.store.values.check`)."""
    check(spec, "agent")
    refuse_credentials(spec.model_settings)
    for index, limit in enumerate(spec.rate_limits):
        check_key_template(index, limit)
