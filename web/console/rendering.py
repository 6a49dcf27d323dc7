"""Console plumbing: templates and filters, the signed-in person, CSRF, flash notices, errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from triloop.config import LOOPS
from web import faults
from web.auth import CSRF_FIELD, FLASH_COOKIE, SESSION_COOKIE, same_secret
from web.console.decisions import Waiting, awaiting_me
from web.deps import (
    Guard,
    Principal,
    ServicesDep,
    SessionDep,
    Sessions,
    WebServices,
    principal_for_session,
)
from web.problems import ProblemError, unauthenticated
from web.request_fields import field_with_nul

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")


def _short(value: object, n: int = 12) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= n + 1 else text[:n] + "…"


def _when(value: object) -> str:
    if not isinstance(value, datetime):
        return "—" if value is None else str(value)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


def flatten(value: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, str]]:
    """Nested evidence as ``(dotted.key, text)`` rows for a table."""
    if isinstance(value, dict) and value and depth < 5:
        for key, item in value.items():
            yield from flatten(item, f"{prefix}.{key}" if prefix else str(key), depth + 1)
    elif isinstance(value, list) and value and depth < 5 and len(value) <= 20:
        for index, item in enumerate(value):
            yield from flatten(item, f"{prefix}[{index}]", depth + 1)
    elif isinstance(value, float):
        yield prefix or "value", _num(value)
    elif isinstance(value, str | int | bool) or value is None:
        yield prefix or "value", "—" if value is None else str(value)
    else:
        yield prefix or "value", json.dumps(value, default=str)[:400]


templates.env.filters.update(short=_short, when=_when, num=_num)
templates.env.globals.update(flatten=flatten)


def _services(request: Request) -> WebServices:
    services: WebServices = request.app.state.services
    return services


async def console_user(request: Request, services: ServicesDep, db: SessionDep) -> Principal:
    """The person signed in with the session cookie; otherwise 401 (the console redirects)."""
    cookie = services.signer.load_session(request.cookies.get(SESSION_COOKIE))
    if cookie is None:
        raise unauthenticated("sign in to use the console")
    found = await db.read(principal_for_session, cookie=cookie)
    if found is None:
        raise unauthenticated("your user is disabled or the token you signed in with expired or "
                              "was revoked; sign in again")
    # Kept for the error page, so that a 403 or 404 still shows the nav of who is signed in.
    request.state.principal = found
    return found


ConsoleUser = Annotated[Principal, Depends(console_user)]


async def console_guard(
    request: Request, services: ServicesDep, principal: ConsoleUser, db: SessionDep
) -> Guard:
    """The policy guard for the console's person (noting a field that holds a NUL), and the
    promotions waiting for their decision (the nav shows how many)."""
    guard = Guard(services, principal, refused_input=await field_with_nul(request))
    # Pages only: the JSON the run page polls (charts) does not need the nav's count.
    if request.method == "GET" and "application/json" not in request.headers.get("accept", ""):
        request.state.waiting = await awaiting_me(guard, db)
        await note_serving_faults(request, guard, services, db)
    return guard


async def note_serving_faults(
    request: Request, guard: Guard, services: WebServices, db: Sessions
) -> None:
    """For the banner every page shows while a serving fault is in force: the faults, for
    whoever the policy lets read them (asked unaudited, as the nav's count is)."""
    if await guard.would_allow("read", faults.KIND):
        request.state.fault_reader = True
        request.state.serving_faults = await faults.faults_in_force(services=services, db=db)


ConsoleGuard = Annotated[Guard, Depends(console_guard)]


def require_csrf(principal: ConsoleUser, csrf_token: Annotated[str, Form()] = "") -> Principal:
    """Every console POST carries the session's csrf token; a forged form gets a 403."""
    if not same_secret(csrf_token, principal.csrf):
        raise ProblemError(403, "Forbidden", "the form's CSRF token is missing or wrong; "
                           "reload the page and try again")
    return principal


CsrfChecked = Annotated[Principal, Depends(require_csrf)]


def page(
    request: Request, name: str, principal: Principal | None, *, status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    """Render a page with the person, their csrf token and any flash notice."""
    services = _services(request)
    flash = services.signer.load_flash(request.cookies.get(FLASH_COOKIE))
    waiting: list[Waiting] | None = getattr(request.state, "waiting", None)
    response = templates.TemplateResponse(
        request, name,
        {"me": principal, "csrf": principal.csrf if principal else None,
         "csrf_field": CSRF_FIELD, "flash": flash,
         "pending_count": None if waiting is None else len(waiting),
         "serving_faults": getattr(request.state, "serving_faults", None) or [],
         "fault_reader": getattr(request.state, "fault_reader", False),
         "temporal_unauthenticated": services.settings.temporal_mode == "dev",
         "agent_code_unisolated": services.settings.sandbox == "local",
         "temporal_ui": services.settings.temporal_ui(),
         "temporal_namespaces": {loop: services.settings.temporal_namespace(loop)
                                 for loop in LOOPS}, **context},
        status_code=status_code,
    )
    if flash is not None:
        response.delete_cookie(FLASH_COOKIE)
    return response


def redirect(request: Request, url: str, *, notice: tuple[str, str] | None = None) -> Response:
    """POST-redirect-GET, with an optional one-time notice (kind, text)."""
    response = RedirectResponse(url, status_code=303)
    if notice is not None:
        value = _services(request).signer.dump_flash(*notice)
        response.set_cookie(FLASH_COOKIE, value, max_age=300, httponly=True, samesite="lax")
    return response


async def render_problem(request: Request, error: ProblemError) -> Response:
    """Console errors: a sign-in redirect for 401, otherwise an error page."""
    if error.status == 401 and request.method == "GET":
        return RedirectResponse(f"/login?next={request.url.path}", status_code=303)
    signed_in: Principal | None = getattr(request.state, "principal", None)
    problem = error.problem()
    # The message once: a policy denial's detail already joins its reasons.
    more = [r for r in problem.reasons or [] if r not in problem.detail]
    response = page(request, "error.html", signed_in, status_code=error.status,
                    error=problem, more_reasons=more, title=error.title,
                    back=_back_link(request))
    response.headers.update(error.headers or {})
    return response


def _back_link(request: Request) -> str | None:
    """Where a failed form came from (this site's page only), for the error page's way back."""
    referer = request.headers.get("referer", "")
    origin = f"{request.url.scheme}://{request.url.netloc}"
    if not referer.startswith(origin + "/"):
        return None
    path = referer[len(origin):]
    return path if not path.startswith("//") and path != request.url.path else None
