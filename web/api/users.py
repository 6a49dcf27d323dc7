"""``/api/me`` and ``/api/users``: who is signed in; admins create people and tokens."""

from __future__ import annotations

from fastapi import APIRouter
from sqlmodel import Session

from web import role_grants, users
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page
from web.problems import ProblemError, invalid, not_found
from web.users import UserCreate, UserCreated, UserError, UserPublic

router = APIRouter(prefix="/api", tags=["users"])


@router.get("/me", response_model=UserPublic)
async def get_me(guard: AuthorizeDep, db: SessionDep) -> UserPublic:
    """The signed-in person and their roles."""
    name = guard.principal.name
    await guard("read", "user", id=name)
    found = await db.read(users.get_user, name=name)
    if found is None:
        raise not_found("user", name)
    return users.public(found)


@router.get("/users", response_model=Page[UserPublic])
async def list_users(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None
) -> Page[UserPublic]:
    """People, newest first (admins)."""
    await guard("read", "user")
    return await db.read(users.list_users, limit=limit, cursor=cursor)


def _create(
    *, session: Session, body: UserCreate, created_by: str, token_lifetime_s: int,
    credential: str | None,
) -> UserCreated:
    roles = users.check_new_user(body.name, body.roles)
    active, privileged = role_grants.split_roles(roles)
    user, token = users.create_user(session=session, name=body.name, roles=active,
                                    created_by=created_by, token_lifetime_s=token_lifetime_s,
                                    allow_no_role=bool(privileged), credential=credential)
    pending = [role_grants.request_grant(session=session, user_name=user.name, role=role,
                                         requested_by=created_by, credential=credential)
               for role in privileged]
    return UserCreated(**users.public(user).model_dump(), token=token,
                       pending_grants=[role_grants.public(g) for g in pending])


@router.post("/users", status_code=201, response_model=UserCreated)
async def create_user(
    body: UserCreate, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> UserCreated:
    """Create a person; the token is in this response only (admins)."""
    await guard("create", "user", id=body.name, attrs={"roles": body.roles})
    for role in role_grants.split_roles(body.roles)[1]:  # each asks for a second admin
        await guard("create", "role_grant", attrs={"user": body.name, "role": role})
    try:
        return await db.write(_create, body=body, created_by=guard.principal.name,
                              token_lifetime_s=services.settings.api_token_lifetime_s,
                              credential=guard.principal.credential)
    except UserError as exc:
        if "already exists" in str(exc):
            raise ProblemError(409, "Conflict", str(exc)) from exc
        raise invalid(str(exc)) from exc
