"""Chorus errors. One root; a branch for misuse and one for runtime failure.

::

    ChorusError
    ├── UserError                 the caller asked for something invalid
    │   ├── UnknownAgentError     agent name not registered by the workers
    │   ├── UnknownToolError      tool name not registered by the workers
    │   ├── UnknownPolicyError    policy name not registered by the workers
    │   ├── InvalidRequestError   payload failed validation (names the field)
    │   │   ├── SecretInSettingsError  a credential in an agent's model_settings
    │   │   ├── SettingNotAllowedError an inline spec names an endpoint or a
    │   │   │                          setting only a registered agent may set
    │   │   └── PatternTimeoutError    a schema's pattern ran out of time
    │   ├── ConversationNotFound
    │   ├── JobNotFound           no job by that id (for the caller)
    │   ├── ToolOutputNotFound    no archived tool output by that handle
    │   ├── ConversationBusyError a turn is running on that conversation
    │   ├── JobNotFinishedError   the job's turn still runs
    │   ├── AuthenticationError   no valid token (HTTP API)
    │   ├── PermissionDeniedError the token's scope does not allow it
    │   ├── ApprovalNotFound      no tool call by that id
    │   ├── ConflictError         the state changed under the request (a call
    │   │                         already answered, or no longer waiting)
    │   └── ConfigurationError    settings missing or contradictory
    └── AgentRunError             something failed while running
        ├── ModelError            the model API failed (status, body)
        ├── ModelBehaviorError    the model answered something unusable
        ├── ToolExecutionError    a tool raised or timed out
        ├── PolicyError           a policy raised or stopped a model call
        ├── JobFailedError        ``Job.result()`` on a failed turn
        └── ServiceUnavailableError  Postgres or Redis failed (or kept
                                  deadlocking) after bounded retries
"""

from __future__ import annotations

from pydantic import ValidationError


class ChorusError(Exception):
    """Root of every error Chorus raises."""


class UserError(ChorusError):
    """The caller asked for something invalid; the message says what to do."""


class UnknownAgentError(UserError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(
            f"unknown agent {name!r}; registered agents: {sorted(known) or 'none'} "
            "(declare it with Agent(...) in a module listed in CHORUS_MODULES)"
        )


class UnknownToolError(UserError):
    def __init__(
        self,
        name: str,
        known: list[str],
        kind: str = "tool",
        declare: str = "declare it with @tool",
    ) -> None:
        self.name = name
        super().__init__(
            f"unknown {kind} {name!r}; registered {kind}s: {sorted(known) or 'none'} "
            f"({declare} in a module listed in CHORUS_MODULES)"
        )


class UnknownPolicyError(UserError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(
            f"unknown policy {name[:200]!r}; registered policies: {sorted(known) or 'none'} "
            "(declare it with @policy or register_policy in a module listed in CHORUS_MODULES)"
        )


class InvalidRequestError(UserError):
    """A payload failed validation. ``fields`` names the offending fields."""

    def __init__(self, message: str, fields: list[str] | None = None) -> None:
        self.fields = fields or []
        super().__init__(message)


class SecretInSettingsError(InvalidRequestError):
    """An agent's ``model_settings`` carry a credential; ``fields`` holds its path."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(
            f"{path}: refused, {why}; model_settings may not carry credentials "
            "(set provider keys in the worker's environment)",
            [path],
        )


class SettingNotAllowedError(InvalidRequestError):
    """An inline spec (one a job supplies) carries what only the workers'
    own configuration may choose: a model endpoint, a key, a price, a
    routing setting. ``fields`` holds its path."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(
            f"{path}: refused, {why}; an inline spec names a model and how it samples, "
            "never where the call goes (declare a registered agent with Agent(...), or list "
            "the endpoint in CHORUS_MODEL_ENDPOINTS)",
            [path],
        )


class PatternTimeoutError(InvalidRequestError):
    """Matching a JSON schema's ``pattern`` took longer than its bound."""

    def __init__(self, pattern: str, seconds: float) -> None:
        self.pattern = pattern
        shown = pattern if len(pattern) <= 100 else f"{pattern[:100]}..."
        super().__init__(
            f"matching the schema's pattern {shown!r} took longer than {seconds} s; "
            "the value is refused",
            ["pattern"],
        )


def invalid(exc: ValidationError, what: str) -> InvalidRequestError:
    """A pydantic validation failure as an :class:`InvalidRequestError`
    naming each offending field (``what``: the thing that was invalid)."""
    fields = [".".join(str(p) for p in e["loc"]) for e in exc.errors()]
    detail = "; ".join(
        f"{field}: {e['msg']}" for field, e in zip(fields, exc.errors(), strict=True)
    )
    return InvalidRequestError(f"invalid {what}: {detail}", fields)


class ConversationNotFound(UserError):
    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        super().__init__(f"no conversation {conversation_id!r}")


class JobNotFound(UserError):
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job {job_id!r}")


class JobNotFinishedError(UserError):
    """The job's turn still runs (its answer was asked for)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id!r} is still running; wait for it to finish")


class AuthenticationError(UserError):
    """No token, or one that is unknown, malformed or revoked (HTTP API)."""


class PermissionDeniedError(UserError):
    """The token's scope does not allow the operation (HTTP API)."""


class ToolOutputNotFound(UserError):
    def __init__(self, handle: str) -> None:
        self.handle = handle
        super().__init__(f"no archived tool output {handle!r} in this conversation's tree")


class NoStructuredOutputError(UserError):
    """``job.output()`` of a job whose agent declares no ``output`` model
    (its answer is text: ``job.result()``)."""

    def __init__(self, job_id: str, agent: str) -> None:
        self.job_id = job_id
        self.agent = agent
        super().__init__(
            f"job {job_id} has no structured output: agent {agent!r} declares no output "
            "model (Agent(output=...)); read its text with result()"
        )


class ConversationBusyError(UserError):
    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        super().__init__(
            f"conversation {conversation_id!r} is running a turn; wait for it to finish"
        )


class ApprovalNotFound(UserError):
    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        super().__init__(f"no tool call {call_id!r}")


class ConflictError(UserError):
    """The request lost to a change made before it: a call answered twice
    (the first answer stands), or a call no longer waiting for one."""


class ConfigurationError(UserError):
    """Settings are missing or contradictory."""


class ClientClosedError(UserError):
    """The client was closed: what waited on it (a result, events) ends, and
    it is not used again."""


class AgentRunError(ChorusError):
    """Something failed while running an agent."""


class ModelError(AgentRunError):
    """The model API failed. Keeps the provider's status and body;
    ``retryable`` for rate limits, timeouts, connection errors and 5xx."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        body: str | None = None,
        retryable: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.retryable = retryable
        super().__init__(message if status is None else f"{message} (status {status})")


class ModelBehaviorError(AgentRunError):
    """The model answered something Chorus cannot use."""


class ToolExecutionError(AgentRunError):
    """A tool raised or timed out."""


class PolicyError(AgentRunError):
    """A policy raised, stopped a model call or rewrote it into something
    Chorus refuses; ``policy`` names it. The turn fails with this error."""

    def __init__(self, policy: str, message: str) -> None:
        self.policy = policy
        super().__init__(f"policy {policy!r} {message}")


class JobFailedError(AgentRunError):
    """The job's turn ended failed or cancelled; ``status`` says which."""

    def __init__(self, job_id: str, status: str, error: str | None) -> None:
        self.job_id = job_id
        self.status = status
        self.error = error
        super().__init__(f"job {job_id} {status}: {error or 'no detail'}")


class ServiceUnavailableError(AgentRunError):
    """Postgres or Redis failed, or a transaction kept losing to concurrent
    ones, after bounded retries. The operation may be repeated; the cause
    is chained as ``__cause__``."""
