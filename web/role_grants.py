"""Two-person role grants (data access): one admin requests a privileged role, another
confirms it, and only then does the role enter ``app_user.roles``.

The database backs the rule: ``role_grant`` refuses a grant decided by its requester and
any change to a decided grant (migration 0007). The web role can neither write
``role_grant`` nor change ``app_user.roles``: a request and a decision go through
``triloop_request_role_grant`` / ``triloop_decide_role_grant``, which take the raw
credential of the admin acting, check it inside the database and stamp ``requested_by`` /
``confirmed_by`` from it; only a confirm there adds the role (migration 0020).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel
from sqlalchemy import text
from sqlmodel import Session, col, select

from triloop.models import RoleGrant, User
from triloop.models._columns import utcnow
from triloop.statuses import GrantStatus
from web.pagination import Page, keyset, page_of

# Roles that let a person supply the second person of a two-person rule.
PRIVILEGED_ROLES = ("operator", "auditor", "admin")


class GrantError(ValueError):
    """A grant that cannot be requested or decided as asked."""


class GrantConflict(GrantError):
    """The grant is already decided or already pending."""


class RoleGrantPublic(BaseModel):
    """A role grant as the API shows it."""

    id: str
    user_name: str
    role: str
    status: str
    requested_by: str
    requested_at: datetime
    confirmed_by: str | None = None
    confirmed_at: datetime | None = None


class RoleGrantRequest(BaseModel):
    """Ask for a privileged role for a person; another admin must confirm it."""

    role: str


def public(grant: RoleGrant) -> RoleGrantPublic:
    """The API view of a grant."""
    return RoleGrantPublic.model_validate(grant, from_attributes=True)


def split_roles(roles: list[str]) -> tuple[list[str], list[str]]:
    """(roles active at once, roles that need a second admin's confirmation)."""
    return ([r for r in roles if r not in PRIVILEGED_ROLES],
            [r for r in roles if r in PRIVILEGED_ROLES])


_REQUEST_SQL = text("SELECT triloop_request_role_grant(:credential, :user_name, :role)")
_DECIDE_SQL = text("SELECT triloop_decide_role_grant(:credential, :grant_id, :confirm)")


def request_grant(*, session: Session, user_name: str, role: str, requested_by: str,
                  credential: str | None = None) -> RoleGrant:
    """A pending grant of a privileged role; refused if held or already pending.

    With ``credential`` (the requesting admin's raw secret) the database stamps
    ``requested_by``; without it only the owner may insert.
    """
    if role not in PRIVILEGED_ROLES:
        what = "needs no grant" if role == "ml_engineer" else "is not a role"
        raise GrantError(f"{role!r} {what}; grants are for {', '.join(PRIVILEGED_ROLES)}")
    user = session.get(User, user_name)
    if user is None:
        raise LookupError(f"user {user_name!r} does not exist")
    if role in user.roles:
        raise GrantConflict(f"user {user_name!r} already holds the {role!r} role")
    pending = session.exec(select(RoleGrant).where(
        RoleGrant.user_name == user_name, RoleGrant.role == role,
        RoleGrant.status == GrantStatus.pending)).first()
    if pending is not None:
        raise GrantConflict(f"grant {pending.id} of {role!r} to {user_name!r} is already"
                            f" pending; another admin confirms it")
    if credential is not None:
        grant_id = session.execute(_REQUEST_SQL, {"credential": credential,
                                                  "user_name": user_name, "role": role}
                                   ).scalar_one()
        stored = session.get(RoleGrant, str(grant_id))
        assert stored is not None  # the function just inserted it
        return stored
    grant = RoleGrant(user_name=user_name, role=role, requested_by=requested_by)
    session.add(grant)
    session.flush()
    return grant


def get_grant(*, session: Session, grant_id: str) -> RoleGrant | None:
    """The grant with this id, if any."""
    return session.get(RoleGrant, grant_id)


def decide_grant(*, session: Session, grant_id: str, decided_by: str, confirm: bool,
                 credential: str | None = None) -> RoleGrant:
    """Confirm (the role becomes active now) or refuse a pending grant.

    With ``credential`` (the deciding admin's raw secret) the database checks it, stamps
    ``confirmed_by`` and adds the role; without it only the owner may write.
    """
    query = select(RoleGrant).where(RoleGrant.id == grant_id)
    # The function locks the row itself (the web role may not: FOR UPDATE needs UPDATE).
    grant = session.exec(query if credential is not None else query.with_for_update()).first()
    if grant is None:
        raise LookupError(f"role grant {grant_id!r} does not exist")
    if grant.status != GrantStatus.pending:
        raise GrantConflict(f"role grant {grant_id} is already {grant.status}")
    if credential is not None:
        session.execute(_DECIDE_SQL, {"credential": credential, "grant_id": grant_id,
                                      "confirm": confirm})
        session.refresh(grant)
        return grant
    now = utcnow()
    grant.status = GrantStatus.active if confirm else GrantStatus.refused
    grant.confirmed_by = decided_by
    grant.confirmed_at = now
    session.add(grant)
    if confirm:
        user = session.exec(
            select(User).where(User.name == grant.user_name).with_for_update()).one()
        if grant.role not in user.roles:
            user.roles = [*user.roles, grant.role]
            session.add(user)
    session.flush()
    return grant


def list_grants(*, session: Session, status: str | None, limit: int,
                cursor: str | None, id_prefix: str | None = None) -> Page[RoleGrantPublic]:
    """Grants, newest first, optionally of one status or starting with an id prefix."""
    statement = select(RoleGrant)
    if status is not None:
        statement = statement.where(RoleGrant.status == status)
    if id_prefix is not None:
        statement = statement.where(col(RoleGrant.id).startswith(id_prefix, autoescape=True))
    statement = keyset(statement, [col(RoleGrant.requested_at), col(RoleGrant.id)], cursor,
                       (datetime, str), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda g: (g.requested_at, g.id), public)
