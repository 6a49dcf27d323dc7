"""``/api/me`` and ``/api/users``: who is signed in; admins create people and tokens."""

from __future__ import annotations

from fastapi import APIRouter
from sqlmodel import Session

from web import users
from web.api.common import ERRORS
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page
from web.problems import ProblemError, invalid, not_found
from web.users import UserCreate, UserCreated, UserError, UserPublic

router = APIRouter(prefix="/api", tags=["users"], responses=ERRORS)


@router.get("/me", response_model=UserPublic)
async def me(guard: AuthorizeDep, db: SessionDep) -> UserPublic:
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
    *, session: Session, body: UserCreate, created_by: str, token_lifetime_s: int
) -> UserCreated:
    user, token = users.create_user(session=session, name=body.name, roles=body.roles,
                                    created_by=created_by, token_lifetime_s=token_lifetime_s)
    return UserCreated(**users.public(user).model_dump(), token=token)


@router.post("/users", status_code=201, response_model=UserCreated)
async def create_user(
    body: UserCreate, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> UserCreated:
    """Create a person; the token is in this response only (admins)."""
    await guard("create", "user", id=body.name, attrs={"roles": body.roles})
    try:
        return await db.write(_create, body=body, created_by=guard.principal.name,
                              token_lifetime_s=services.settings.api_token_lifetime_s)
    except UserError as exc:
        if "already exists" in str(exc):
            raise ProblemError(409, "Conflict", str(exc)) from exc
        raise invalid(str(exc)) from exc
