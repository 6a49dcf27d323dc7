"""Typed FastAPI dependencies: ``SessionDep``, ``CurrentUser``, ``AuthorizeDep``, ``ServicesDep``.

Routes declare these and stay thin. The adapters themselves (engine, authorizer,
Temporal) are built once in ``web.app`` and kept on ``app.state.services``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlmodel import Session

from triloop.audit import READ_ACTIONS
from triloop.config import Settings
from triloop.db import session_scope
from triloop.policy import Actor, Authorizer, Decision, OpaClient, PolicyDenied, Resource
from web import tokens, users
from web.auth import (
    CSRF_HEADER,
    SESSION_COOKIE,
    ConsoleSession,
    CookieSigner,
    bearer_token,
    same_secret,
)
from web.orchestration import Orchestrator
from web.problems import ProblemError, invalid, unauthenticated
from web.request_fields import escape_nul, field_with_nul
from web.request_limits import ValidationPool

T = TypeVar("T")


@dataclass
class WebServices:
    """The real adapters of the web service, built in ``web.app`` only."""

    settings: Settings
    engine: Engine
    authorizer: Authorizer
    hints: OpaClient  # unaudited "would this be allowed?" for hiding buttons only
    orchestrator: Orchestrator
    signer: CookieSigner
    validation: ValidationPool  # CPU-heavy checks, off the event loop, time-limited


def get_services(request: Request) -> WebServices:
    """The services built by ``create_app``."""
    services: WebServices = request.app.state.services
    return services


ServicesDep = Annotated[WebServices, Depends(get_services)]


class Sessions:
    """Runs data-access functions in a worker thread, each in its own transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def read(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """``fn(session=..., **kwargs)`` in a read-only use of a session."""
        return await asyncio.to_thread(self._run, fn, kwargs)

    async def write(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """``fn(session=..., **kwargs)`` in a transaction that commits on success."""
        return await asyncio.to_thread(self._run, fn, kwargs)

    def _run(self, fn: Callable[..., T], kwargs: Mapping[str, Any]) -> T:
        with session_scope(self._engine) as session:
            return fn(session=session, **kwargs)


def get_sessions(services: ServicesDep) -> Sessions:
    """Sessions on the web role's engine."""
    return Sessions(services.engine)


SessionDep = Annotated[Sessions, Depends(get_sessions)]


@dataclass(frozen=True)
class Principal:
    """The signed-in person; ``csrf`` is set when they came with the console cookie.

    ``token_id`` names the API token that proved them (directly, or when the console
    session was opened): revoking or expiring it ends the console session too.
    ``credential`` is the raw secret of this request (the bearer token, or the console
    session's secret): the web service relays it to the database functions that record a
    decision or an audit row for the person, which check it themselves.
    """

    name: str
    roles: tuple[str, ...]
    csrf: str | None = None
    token_id: str | None = None
    credential: str | None = field(default=None, repr=False, compare=False)

    @property
    def actor(self) -> Actor:
        """The policy actor: this person through the web service (with this request's secret)."""
        return Actor(service="web", user=self.name, roles=self.roles, credential=self.credential)


def principal_for_token(*, session: Session, token: str) -> Principal:
    """The person a bearer token proves, or ``TokenRefused`` (unknown, expired, revoked)."""
    user, row = tokens.authenticate(session=session, token=token)
    return Principal(user.name, tuple(user.roles), token_id=row.id, credential=token)


def principal_for_session(*, session: Session, cookie: ConsoleSession) -> Principal | None:
    """The person of a console session, while they are enabled, it is open and its token
    is live."""
    user = users.get_user(session=session, name=cookie.user)
    if user is None or cookie.secret is None:
        return None
    live = tokens.live_console_session(session=session, secret=cookie.secret,
                                       user_name=user.name)
    if live is None or (cookie.token_id is not None and live.token_id != cookie.token_id):
        return None
    if not tokens.active_token(session=session, token_id=live.token_id, user_name=user.name):
        return None
    return Principal(user.name, tuple(user.roles), csrf=cookie.csrf, token_id=live.token_id,
                     credential=cookie.secret)


async def optional_user(
    request: Request, services: ServicesDep, db: SessionDep
) -> Principal | None:
    """The person behind a bearer token or the console cookie, if any."""
    token = bearer_token(request.headers.get("authorization"))
    if token is not None:
        try:
            return await db.read(principal_for_token, token=token)
        except tokens.TokenRefused as refused:
            raise unauthenticated(str(refused), invalid_token=True) from refused
    cookie = services.signer.load_session(request.cookies.get(SESSION_COOKIE))
    if cookie is None:
        return None
    return await db.read(principal_for_session, cookie=cookie)


async def current_user(
    request: Request, principal: Annotated[Principal | None, Depends(optional_user)]
) -> Principal:
    """The signed-in person, or 401; unsafe calls with the cookie need the csrf header."""
    if principal is None:
        raise unauthenticated(
            "sign in: send 'Authorization: Bearer <token>' (triloop users create prints one)"
        )
    if principal.csrf is not None and request.method not in ("GET", "HEAD", "OPTIONS"):
        if request.url.path.startswith("/api") and not same_secret(
            request.headers.get(CSRF_HEADER), principal.csrf
        ):
            raise ProblemError(
                403, "Forbidden", "a cookie-authenticated change needs the X-CSRF-Token header"
            )
    return principal


CurrentUser = Annotated[Principal, Depends(current_user)]


@dataclass(frozen=True)
class AuthorizedAction:
    """One allowed action of this request, with OPA's id for the decision."""

    action: str
    resource: Resource
    decision_id: str | None


class Guard:
    """Asks the policy for the current person; every route goes through it.

    ``refused_input`` names a field of this request that holds a NUL character. Such a
    request is still asked about (and so audited, with each NUL shown as ``\\u0000``),
    then refused with 422 whatever the policy says.
    """

    def __init__(
        self, services: WebServices, principal: Principal, refused_input: str | None = None
    ) -> None:
        self._services = services
        self.principal = principal
        self.refused_input = refused_input
        # Allowed actions other than reads: their outcome is audited next to them
        # (web.audit_outcomes), so an allowed approve that then got 409 reads as refused.
        self.authorized: list[AuthorizedAction] = []

    @property
    def engine(self) -> Engine:
        """The web role's engine (the outcome recorder appends with it)."""
        return self._services.engine

    async def __call__(
        self,
        action: str,
        kind: str,
        *,
        id: str | None = None,
        owner: str | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        """Authorize (audited); raises ``PolicyDenied`` (a 403) when refused."""
        resource = Resource(kind=kind, id=id, owner=owner, attrs=dict(attrs or {}))
        if self.refused_input is not None:
            await self._refuse(action, resource)
        decision = await self._services.authorizer.authorize_async(
            self.principal.actor, action, resource)
        if action not in READ_ACTIONS:
            self.authorized.append(AuthorizedAction(action, resource, decision.decision_id))

    async def screen(self, action: str, kind: str, *, id: str | None = None) -> None:
        """Before reading the facts a decision needs: refuse (audited) a request with a NUL."""
        if self.refused_input is not None:
            await self._refuse(action, Resource(kind=kind, id=id))

    async def _refuse(self, action: str, resource: Resource) -> None:
        problem = f"{self.refused_input} contains a NUL character, which no field accepts"
        shown = Resource(kind=resource.kind, id=escape_nul(resource.id),
                         owner=escape_nul(resource.owner), attrs=escape_nul(dict(resource.attrs)))
        try:
            await self._services.authorizer.authorize_async(
                self.principal.actor, action, shown, context={"refused_input": problem})
        except PolicyDenied:
            pass  # the denial is on record; the answer is the input's problem either way
        raise invalid(problem + "; remove it and send the request again")

    async def allows(self, action: str, kind: str, **resource: Any) -> bool:
        """Authorize (audited) but answer False instead of raising."""
        try:
            await self(action, kind, **resource)
        except PolicyDenied:
            return False
        return True

    async def would_allow(
        self, action: str, kind: str, *, id: str | None = None, owner: str | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> bool:
        """Unaudited policy question, only to decide whether to show a button."""
        decision = await self.hint(action, kind, id=id, owner=owner, attrs=attrs)
        return decision.allow

    async def hint(
        self, action: str, kind: str, *, id: str | None = None, owner: str | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> Decision:
        """``would_allow`` with the policy's reasons, so a page can say why it offers nothing."""
        resource = Resource(kind=kind, id=escape_nul(id), owner=escape_nul(owner),
                            attrs=escape_nul(dict(attrs or {})))
        return await self._services.hints.adecide(self.principal.actor, action, resource)


async def get_guard(request: Request, services: ServicesDep, principal: CurrentUser) -> Guard:
    """The guard for this request's person (noting a field that holds a NUL character)."""
    guard = Guard(services, principal, refused_input=await field_with_nul(request))
    request.state.guard = guard  # the outcome recorder reads what it authorized
    return guard


AuthorizeDep = Annotated[Guard, Depends(get_guard)]
