"""Two-person role grants: one admin requests a privileged role, another confirms it.

``POST /api/users/{name}/roles`` asks; ``POST /api/role-grants/{id}/confirm`` (the role
becomes active now) or ``/refuse`` decides; OPA refuses the requester deciding their own
request, and so does the database. ``GET /api/role-grants`` lists them (admins).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from triloop.statuses import GrantStatus
from web import role_grants
from web.api.common import IdPrefix
from web.deps import AuthorizeDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page
from web.problems import conflict, invalid, not_found
from web.role_grants import GrantConflict, GrantError, RoleGrantPublic, RoleGrantRequest

router = APIRouter(prefix="/api", tags=["users"])

StatusParam = Annotated[GrantStatus | None, Query()]


@router.post("/users/{name}/roles", status_code=201, response_model=RoleGrantPublic)
async def request_role(
    name: str, body: RoleGrantRequest, guard: AuthorizeDep, db: SessionDep
) -> RoleGrantPublic:
    """Ask for a privileged role for a person; pending until another admin confirms."""
    await guard("create", "role_grant", attrs={"user": name, "role": body.role})
    try:
        grant = await db.write(role_grants.request_grant, user_name=name, role=body.role,
                               requested_by=guard.principal.name,
                               credential=guard.principal.credential)
    except LookupError as exc:
        raise not_found("user", name) from exc
    except GrantConflict as exc:
        raise conflict(str(exc)) from exc
    except GrantError as exc:
        raise invalid(str(exc)) from exc
    return role_grants.public(grant)


async def _decide(grant_id: str, action: str, guard: AuthorizeDep,
                  db: SessionDep) -> RoleGrantPublic:
    await guard.screen(action, "role_grant", id=grant_id)
    grant = await db.read(role_grants.get_grant, grant_id=grant_id)
    if grant is None:
        raise not_found("role grant", grant_id)
    # requested_by comes from the row, never from the request: the policy's duty check.
    await guard(action, "role_grant", id=grant_id, attrs={
        "requested_by": grant.requested_by, "user": grant.user_name, "role": grant.role})
    try:
        decided = await db.write(role_grants.decide_grant, grant_id=grant_id,
                                 decided_by=guard.principal.name, confirm=action == "confirm",
                                 credential=guard.principal.credential)
    except GrantConflict as exc:
        raise conflict(str(exc)) from exc
    return role_grants.public(decided)


@router.post("/role-grants/{grant_id}/confirm", response_model=RoleGrantPublic)
async def confirm_grant(grant_id: str, guard: AuthorizeDep, db: SessionDep) -> RoleGrantPublic:
    """Confirm another admin's request: the role becomes active now (admins)."""
    return await _decide(grant_id, "confirm", guard, db)


@router.post("/role-grants/{grant_id}/refuse", response_model=RoleGrantPublic)
async def refuse_grant(grant_id: str, guard: AuthorizeDep, db: SessionDep) -> RoleGrantPublic:
    """Refuse another admin's request: the role never becomes active (admins)."""
    return await _decide(grant_id, "refuse", guard, db)


@router.get("/role-grants", response_model=Page[RoleGrantPublic])
async def list_grants(
    guard: AuthorizeDep, db: SessionDep, status: StatusParam = None, limit: LimitParam = 50,
    cursor: CursorParam = None, id_prefix: IdPrefix | None = None,
) -> Page[RoleGrantPublic]:
    """Role grants, newest first, optionally of one status or id prefix (admins, auditors)."""
    await guard("read", "role_grant")
    return await db.read(role_grants.list_grants, status=status, limit=limit, cursor=cursor,
                         id_prefix=id_prefix)
