"""The HTTP API's bearer tokens (``chorus token ...``, ``orchestrator/server``).

A token reads ``chorus_<prefix>_<secret>``: the prefix (8 hex characters)
is stored as it is, so a token can be named in ``chorus token list`` and
revoked by it; the whole token is stored only as its SHA-256. A token has
192 random bits, so a fast hash is enough (a slow one protects guessable
passwords, which these are not). Nothing else keeps the token: it is
printed once, at creation.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import or_, update
from sqlmodel import Field, Session, SQLModel, col, select

from orchestrator.store.tables import UTCDateTime, new_id, utcnow

TOKEN_PREFIX = "chorus"


class Scope(StrEnum):
    """What a token may do: ``read`` reads; ``submit`` also submits,
    cancels, sends, clears and forks; ``admin`` also reads and lists every
    tenant's jobs."""

    READ = "read"
    SUBMIT = "submit"
    ADMIN = "admin"

    def allows(self, needed: Scope) -> bool:
        order = (Scope.READ, Scope.SUBMIT, Scope.ADMIN)
        return order.index(self) >= order.index(needed)


class ApiToken(SQLModel, table=True):
    __tablename__ = "chorus_api_token"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=64)
    name: str | None = Field(default=None, max_length=200)
    prefix: str = Field(unique=True, max_length=16)
    hash: str = Field(max_length=64)
    tenant: str = Field(max_length=64)
    scope: str = Field(max_length=16)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime, nullable=False)
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime, nullable=True)


@dataclass(frozen=True)
class Principal:
    """Who a request is: the token's id, name, tenant and scope."""

    token_id: str
    name: str | None
    tenant: str
    scope: Scope


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create(session: Session, tenant: str, scope: Scope, name: str | None) -> tuple[ApiToken, str]:
    """A new token's row (added to ``session``) and the token itself."""
    prefix, secret = secrets.token_hex(4), secrets.token_hex(24)
    token = f"{TOKEN_PREFIX}_{prefix}_{secret}"
    row = ApiToken(name=name, prefix=prefix, hash=_digest(token), tenant=tenant, scope=scope)
    session.add(row)
    return row, token


def verify(session: Session, token: str) -> Principal | None:
    """The principal of a valid, unrevoked token; None for any other string."""
    head, _, rest = token.partition("_")
    prefix, _, secret = rest.partition("_")
    if head != TOKEN_PREFIX or not prefix or not secret or len(prefix) > 16:
        return None
    row = session.exec(select(ApiToken).where(ApiToken.prefix == prefix)).first()
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.hash, _digest(token)):
        return None
    return Principal(row.id, row.name, row.tenant, Scope(row.scope))


#: Ids per query of :func:`unrevoked` (bound parameters have a cap).
_CHUNK = 1000


def unrevoked(session: Session, ids: list[str]) -> set[str]:
    """Which of the tokens ``ids`` exist and are not revoked (by primary key)."""
    found: set[str] = set()
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        query = select(ApiToken.id).where(
            col(ApiToken.id).in_(chunk), col(ApiToken.revoked_at).is_(None)
        )
        found.update(session.exec(query).all())
    return found


def revoke(session: Session, prefix_or_id: str) -> int:
    """Revoke the token with this prefix or id; how many were revoked (0 or 1)."""
    result = session.execute(
        update(ApiToken)
        .where(
            or_(col(ApiToken.prefix) == prefix_or_id, col(ApiToken.id) == prefix_or_id),
            col(ApiToken.revoked_at).is_(None),
        )
        .values(revoked_at=utcnow())
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def revoke_named(session: Session, tenant: str, name: str) -> int:
    """Revoke every active token of ``tenant`` named ``name``; how many."""
    result = session.execute(
        update(ApiToken)
        .where(
            col(ApiToken.tenant) == tenant,
            col(ApiToken.name) == name,
            col(ApiToken.revoked_at).is_(None),
        )
        .values(revoked_at=utcnow())
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def listed(session: Session) -> list[ApiToken]:
    """Every token, oldest first (their hashes included: never print them)."""
    return list(session.exec(select(ApiToken).order_by(col(ApiToken.created_at))).all())
