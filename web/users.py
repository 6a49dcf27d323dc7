"""People (data access). Tokens: ``web.tokens``.

The web role may insert a person without a privileged role and update only ``disabled``
and ``last_seen_at``; operator, auditor and admin come from a confirmed grant
(``web.role_grants``), founding admins from the owner on the server (migration 0020).
"""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlmodel import Session, col, select

from triloop.models import User
from web import tokens
from web.pagination import Page, keyset, page_of
from web.role_grants import RoleGrantPublic

ROLES = ("ml_engineer", "operator", "auditor", "admin")
USER_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


class UserError(ValueError):
    """A user that cannot be created as asked."""


class UserPublic(BaseModel):
    """A person as the API shows them (never the token or its hash)."""

    name: str
    roles: list[str]
    disabled: bool
    created_by: str
    created_at: datetime
    last_seen_at: datetime | None = None


class UserCreate(BaseModel):
    """A new person: a lowercase name and at least one role."""

    name: str = Field(pattern=USER_NAME.pattern, description="lowercase, e.g. alice")
    roles: list[str] = Field(min_length=1, max_length=4, description=f"from {', '.join(ROLES)}")


class UserCreated(UserPublic):
    """A created user with their API token, shown this once, and their pending grants."""

    token: str
    pending_grants: list[RoleGrantPublic] = Field(
        default_factory=list,
        description="privileged roles another admin must confirm before they are active")


def public(user: User) -> UserPublic:
    """The API view of a user."""
    return UserPublic(
        name=user.name, roles=list(user.roles), disabled=user.disabled,
        created_by=user.created_by, created_at=user.created_at, last_seen_at=user.last_seen_at,
    )


def check_new_user(name: str, roles: list[str], *, allow_no_role: bool = False) -> list[str]:
    """Validate a name and roles; returns the roles de-duplicated in order."""
    if not USER_NAME.match(name):
        raise UserError(
            f"user name {name!r} must be lowercase letters, digits, '_', '.' or '-', "
            "starting with a letter (at most 64)"
        )
    unknown = [role for role in roles if role not in ROLES]
    if unknown:
        raise UserError(f"unknown role(s) {', '.join(unknown)}; use {', '.join(ROLES)}")
    if not roles and not allow_no_role:
        raise UserError(f"a user needs at least one role: {', '.join(ROLES)}")
    return list(dict.fromkeys(roles))


def create_user(
    *, session: Session, name: str, roles: list[str], created_by: str, token_lifetime_s: int,
    allow_no_role: bool = False, credential: str | None = None,
) -> tuple[User, str]:
    """Insert a user with a fresh expiring token; returns the user and the token (store nowhere).

    ``allow_no_role``: the person starts with no active role because every role they asked
    for is a pending grant. ``credential``: the creating admin's raw secret, which the
    database checks before it issues the first token (none: the owner, on the server).
    """
    roles = check_new_user(name, roles, allow_no_role=allow_no_role)
    if session.get(User, name) is not None:
        raise UserError(f"user {name!r} already exists")
    user = User(name=name, roles=roles, created_by=created_by)
    session.add(user)
    session.flush()
    _, token = tokens.issue_token(session=session, user_name=name, created_by=created_by,
                                  lifetime_s=token_lifetime_s, label="issued with the user",
                                  credential=credential)
    return user, token


FIRST_ADMIN_LOCK = text("SELECT pg_advisory_xact_lock(hashtext('triloop.first_admin'))")
# Two admins: the fewest that can grant a privileged role (one requests, another confirms).
FOUNDING_ADMINS = 2


def create_first_admin(*, session: Session, name: str, created_by: str,
                       token_lifetime_s: int) -> tuple[User, str]:
    """A founding admin, on the server, while fewer than two admins exist; refused after."""
    session.execute(FIRST_ADMIN_LOCK)  # two founders at once: the second sees the first
    admins = session.exec(
        select(User.name).where(col(User.roles).contains(["admin"]))
        .limit(FOUNDING_ADMINS)).all()
    if len(admins) >= FOUNDING_ADMINS:
        raise UserError(
            f"{len(admins)} admins already exist, so this is not a founding admin: an admin"
            " creates users through the API (`triloop users add NAME --role ROLE --token"
            " ADMIN_TOKEN`) and another admin confirms privileged roles")
    return create_user(session=session, name=name, roles=["admin"], created_by=created_by,
                       token_lifetime_s=token_lifetime_s)


def get_user(*, session: Session, name: str) -> User | None:
    """The enabled user with this name, if any."""
    user = session.get(User, name)
    if user is None or user.disabled:
        return None
    return user


def list_users(*, session: Session, limit: int, cursor: str | None) -> Page[UserPublic]:
    """Users, newest first."""
    statement = keyset(
        select(User), [col(User.created_at), col(User.name)], cursor, (datetime, str), limit
    )
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda u: (u.created_at, u.name), public)
