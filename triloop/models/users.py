"""People who use the API and console, and their API tokens (stored hashed, expiring)."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field, SQLModel

from triloop.models._columns import created_at_field, new_id, text_array_field, timestamp_field


class User(SQLModel, table=True):
    """A person with roles: ml_engineer, operator, auditor, admin."""

    __tablename__ = "app_user"
    name: str = Field(primary_key=True)
    roles: list[str] = text_array_field()
    disabled: bool = False
    created_by: str
    created_at: datetime = created_at_field()
    last_seen_at: datetime | None = timestamp_field()


class ApiToken(SQLModel, table=True):
    """One API token of a person: only its sha256 is stored; it expires and can be revoked.

    Only ``triloop_web`` may read this table (the hashes stay out of every loop's
    reach), and it may change only the revocation columns: never a hash or an expiry.
    """

    __tablename__ = "api_token"
    id: str = Field(default_factory=new_id, primary_key=True)
    user_name: str = Field(foreign_key="app_user.name", index=True)
    token_hash: str = Field(unique=True, description="sha256 of the token; never the token")
    label: str = Field(default="", description="what the owner uses it for")
    created_by: str
    created_at: datetime = created_at_field()
    expires_at: datetime = timestamp_field(nullable=False)
    revoked_at: datetime | None = timestamp_field()
    revoked_by: str | None = None


class ConsoleSession(SQLModel, table=True):
    """One console sign-in: the sha256 of a secret the database made once it checked the
    person's API token (``triloop_sign_in``, migration 0020). The web role may read it,
    never write it, so it cannot open a session for anyone who did not sign in."""

    __tablename__ = "console_session"
    id: str = Field(primary_key=True)
    user_name: str = Field(foreign_key="app_user.name", index=True)
    token_id: str = Field(foreign_key="api_token.id")
    secret_hash: str = Field(unique=True, description="sha256 of the session's secret")
    created_at: datetime = created_at_field()
    expires_at: datetime = timestamp_field(nullable=False)
    ended_at: datetime | None = timestamp_field()


class RoleGrant(SQLModel, table=True):
    """A privileged role asked for by one admin; it is active only once another confirms.

    The database refuses a grant decided by its requester and any change to a decided
    grant (migration 0007). ``confirmed_at`` of an active grant is when the role began.
    """

    __tablename__ = "role_grant"
    id: str = Field(default_factory=new_id, primary_key=True)
    user_name: str = Field(foreign_key="app_user.name", index=True)
    role: str = Field(description="operator, auditor or admin")
    requested_by: str
    requested_at: datetime = created_at_field()
    confirmed_by: str | None = Field(default=None, description="the admin who decided it")
    confirmed_at: datetime | None = timestamp_field()
    status: str = Field(default="pending", description="pending, active or refused")
