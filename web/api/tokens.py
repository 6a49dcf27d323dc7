"""``/api/tokens``: list, issue (for oneself) and revoke API tokens; every call is authorized.

People manage their own tokens; an admin may list and revoke anyone's, so a lost
or leaked token can be shut off. Nobody issues a token for someone else through
the API (that would let one person act as another).
"""

from __future__ import annotations

from fastapi import APIRouter
from sqlmodel import Session

from web import tokens
from web.api.common import Short
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page
from web.problems import conflict, not_found
from web.tokens import TokenCreate, TokenIssued, TokenPublic

router = APIRouter(prefix="/api/tokens", tags=["tokens"])


@router.get("", response_model=Page[TokenPublic])
async def list_tokens(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    user: Short | None = None,
) -> Page[TokenPublic]:
    """A person's tokens, newest first: one's own by default; anyone's for admins."""
    owner = user if user is not None else guard.principal.name
    await guard("read", "api_token", owner=owner)
    return await db.read(tokens.list_tokens, limit=limit, cursor=cursor, user_name=owner)


def _issue(*, session: Session, user_name: str, lifetime_s: int, label: str,
           credential: str | None) -> TokenIssued:
    row, token = tokens.issue_token(session=session, user_name=user_name, created_by=user_name,
                                    lifetime_s=lifetime_s, label=label, credential=credential)
    return TokenIssued(**tokens.public(row).model_dump(), token=token)


@router.post("", status_code=201, response_model=TokenIssued)
async def issue_token(
    body: TokenCreate, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> TokenIssued:
    """A new token for oneself (shown once); it expires after at most the service's lifetime."""
    me = guard.principal.name
    longest = services.settings.api_token_lifetime_s
    lifetime = min(body.lifetime_s or longest, longest)
    await guard("create", "api_token", owner=me, attrs={"lifetime_s": lifetime})
    return await db.write(_issue, user_name=me, lifetime_s=lifetime, label=body.label,
                          credential=guard.principal.credential)


@router.post("/{token_id}/revoke", response_model=TokenPublic)
async def revoke_token(token_id: str, guard: AuthorizeDep, db: SessionDep) -> TokenPublic:
    """Revoke a token at once (its owner or an admin); it can never authenticate again."""
    await guard.screen("revoke", "api_token", id=token_id)
    row = await db.read(tokens.get_token, token_id=token_id)
    if row is None:
        raise not_found("API token", token_id)
    await guard("revoke", "api_token", id=token_id, owner=row.user_name)
    try:
        return await db.write(tokens.revoke_token, token_id=token_id,
                              revoked_by=guard.principal.name)
    except tokens.TokenError as exc:
        raise conflict(str(exc)) from exc
