"""API tokens (data access): issued with an expiry, listed without their hash, revoked.

A token authenticates only while it is unexpired, unrevoked and its person is
enabled. The web role may set the revocation columns, nothing else (migration 0003): it
issues a token only through ``triloop_issue_token``, which checks the raw credential of
the person asking inside the database (a person issues their own; an admin only the first
token of a new person), so the web service cannot mint a token for anyone (0020).
Console sessions are made the same way, by ``triloop_sign_in`` from the person's token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlmodel import Session, col, select

from triloop.models import ApiToken, ConsoleSession, User
from triloop.models._columns import utcnow
from web.auth import hash_token, new_token
from web.pagination import Page, keyset, page_of

TokenState = Literal["active", "expired", "revoked"]


class TokenRefused(Exception):
    """A bearer token that does not authenticate; the message says why and what to do."""


class TokenError(ValueError):
    """A token request that cannot be honoured (unknown id, already revoked)."""


class TokenPublic(BaseModel):
    """A token as the API shows it: never the token or its hash."""

    id: str
    user: str
    label: str
    state: TokenState
    created_by: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None = None
    revoked_by: str | None = None


class TokenIssued(TokenPublic):
    """A newly issued token with its secret, shown this once."""

    token: str


class TokenCreate(BaseModel):
    """A new token for oneself; it expires after the lifetime (at most the service's)."""

    label: str = Field(default="", max_length=200, description="what it is for")
    lifetime_s: int | None = Field(
        default=None, ge=60, le=10 * 365 * 86400,
        description="seconds until it expires; at most TRILOOP_API_TOKEN_LIFETIME_S",
    )


def state_of(row: ApiToken, now: datetime) -> TokenState:
    """Whether a token authenticates now."""
    if row.revoked_at is not None:
        return "revoked"
    return "expired" if row.expires_at <= now else "active"


def public(row: ApiToken, now: datetime | None = None) -> TokenPublic:
    """The API view of a token."""
    return TokenPublic(
        id=row.id, user=row.user_name, label=row.label, state=state_of(row, now or utcnow()),
        created_by=row.created_by, created_at=row.created_at, expires_at=row.expires_at,
        revoked_at=row.revoked_at, revoked_by=row.revoked_by,
    )


_ISSUE_SQL = text("SELECT triloop_issue_token(:credential, :user_name, :token_hash, :label,"
                  " :lifetime_s)")
_SIGN_IN_SQL = text("SELECT session_id, user_name, token_id, secret"
                    " FROM triloop_sign_in(:token, :lifetime_s)")
_SIGN_OUT_SQL = text("SELECT triloop_sign_out(:secret)")


def issue_token(
    *, session: Session, user_name: str, created_by: str, lifetime_s: int, label: str = "",
    credential: str | None = None,
) -> tuple[ApiToken, str]:
    """A fresh token for a person; returns the row and the token (store nowhere).

    ``credential`` is the raw secret of the person asking: the database stamps
    ``created_by`` from it. Without one the row is inserted directly, which only the owner
    may do (the server's CLI, ``triloop users token``).
    """
    token = new_token()
    if credential is not None:
        token_id = session.execute(_ISSUE_SQL, {
            "credential": credential, "user_name": user_name, "token_hash": hash_token(token),
            "label": label, "lifetime_s": lifetime_s}).scalar_one()
        row = session.get(ApiToken, str(token_id))
        assert row is not None  # the function just inserted it
        return row, token
    now = utcnow()
    row = ApiToken(
        user_name=user_name, token_hash=hash_token(token), label=label, created_by=created_by,
        created_at=now, expires_at=now + timedelta(seconds=lifetime_s),
    )
    session.add(row)
    session.flush()
    return row, token


@dataclass(frozen=True)
class SignedIn:
    """A console session the database opened for the person whose token it checked."""

    user_name: str
    token_id: str
    secret: str = field(repr=False)


def sign_in(*, session: Session, token: str, lifetime_s: int) -> SignedIn:
    """Open a console session from the person's API token (checked by the database)."""
    row = session.execute(_SIGN_IN_SQL, {"token": token, "lifetime_s": lifetime_s}).one()
    return SignedIn(user_name=str(row[1]), token_id=str(row[2]), secret=str(row[3]))


def sign_out(*, session: Session, secret: str) -> None:
    """End the console session whose secret this is."""
    session.execute(_SIGN_OUT_SQL, {"secret": secret})


def live_console_session(*, session: Session, secret: str,
                         user_name: str) -> ConsoleSession | None:
    """The open, unexpired console session of this person with this secret, if any."""
    row = session.exec(select(ConsoleSession).where(
        ConsoleSession.secret_hash == hash_token(secret),
        ConsoleSession.user_name == user_name)).first()
    if row is None or row.ended_at is not None or row.expires_at <= utcnow():
        return None
    return row


def authenticate(*, session: Session, token: str) -> tuple[User, ApiToken]:
    """The enabled person and the live token behind a bearer token, or ``TokenRefused``."""
    row = session.exec(select(ApiToken).where(ApiToken.token_hash == hash_token(token))).first()
    if row is None:
        raise TokenRefused("the bearer token is unknown")
    now = utcnow()
    state = state_of(row, now)
    if state == "revoked":
        raise TokenRefused(
            f"the bearer token {row.id} was revoked by {row.revoked_by} at "
            f"{_when(row.revoked_at)}; use another token or ask for a new one"
        )
    if state == "expired":
        raise TokenRefused(
            f"the bearer token {row.id} expired at {_when(row.expires_at)}; issue a new one "
            "(POST /api/tokens with a valid token, or `triloop users token NAME` on the server)"
        )
    user = session.get(User, row.user_name)
    if user is None or user.disabled:
        raise TokenRefused(f"the bearer token's user {row.user_name} is disabled")
    return user, row


def active_token(*, session: Session, token_id: str, user_name: str) -> bool:
    """Whether this token of this person still authenticates (console sessions check it)."""
    row = session.get(ApiToken, token_id)
    return row is not None and row.user_name == user_name and state_of(row, utcnow()) == "active"


def get_token(*, session: Session, token_id: str) -> ApiToken | None:
    """A token row by id."""
    return session.get(ApiToken, token_id)


def list_tokens(
    *, session: Session, limit: int, cursor: str | None, user_name: str | None
) -> Page[TokenPublic]:
    """Tokens, newest first; one person's when ``user_name`` is given."""
    statement = select(ApiToken)
    if user_name is not None:
        statement = statement.where(ApiToken.user_name == user_name)
    statement = keyset(statement, [col(ApiToken.created_at), col(ApiToken.id)], cursor,
                       (datetime, str), limit)
    now = utcnow()
    return page_of(list(session.exec(statement)), limit, lambda t: (t.created_at, t.id),
                   lambda t: public(t, now))


def revoke_token(*, session: Session, token_id: str, revoked_by: str) -> TokenPublic:
    """Revoke a token now; revoking twice is refused so the first revocation stays on record."""
    row = session.get(ApiToken, token_id, with_for_update=True)
    if row is None:
        raise TokenError(f"no API token with id {token_id!r}")
    if row.revoked_at is not None:
        raise TokenError(f"token {token_id} was already revoked by {row.revoked_by} at "
                         f"{_when(row.revoked_at)}")
    row.revoked_at = utcnow()
    row.revoked_by = revoked_by
    session.add(row)
    session.flush()
    return public(row)


def _when(value: datetime | None) -> str:
    return "?" if value is None else value.isoformat(timespec="seconds")
