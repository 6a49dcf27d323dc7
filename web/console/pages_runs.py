"""Console pages: sign-in, overview, runs (filtered, selected for comparison), a run with
live charts, progress and pause/resume/cancel, and several runs compared."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import quote

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import StringConstraints

from triloop.statuses import RunStatus
from web import actions, tokens
from web.api.runs import compared
from web.auth import (
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    ConsoleSession,
    new_csrf_token,
    same_secret,
)
from web.console.charts import compare_chart_data, run_chart_data
from web.console.decisions import awaiting_me
from web.console.rendering import (
    ConsoleGuard,
    CsrfChecked,
    page,
    redirect,
)
from web.data import run_compare, runs
from web.data.serving import serving_now
from web.data.transcripts import no_trainable_data_iteration
from web.deps import Guard, ServicesDep, SessionDep, principal_for_token
from web.pagination import CursorParam
from web.problems import ProblemError, invalid, not_found
from web.request_fields import field_with_nul
from web.tokens import TokenRefused

router = APIRouter(include_in_schema=False)


def _safe_next(target: str | None) -> str:
    # Only local paths: never an open redirect to another site.
    if target and target.startswith("/") and not target.startswith("//"):
        return target
    return "/"


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, services: ServicesDep, next: str | None = None) -> Response:
    """The sign-in form (an API token), with a CSRF token bound to this browser."""
    token = new_csrf_token()
    response = page(request, "login.html", None, title="Sign in", login_csrf=token,
                    next=_safe_next(next), error=None)
    response.set_cookie(LOGIN_CSRF_COOKIE, services.signer.dump_login_csrf(token),
                        max_age=3600, httponly=True, samesite="strict")
    return response


@router.post("/login", response_class=HTMLResponse)
async def login(
    request: Request, services: ServicesDep, db: SessionDep,
    token: Annotated[str, Form(max_length=500)] = "",
    csrf_token: Annotated[str, Form(max_length=200)] = "",
    next: Annotated[str, Form(max_length=500)] = "/",
) -> Response:
    """Check the token, have the database open a console session, set the signed cookie.

    The session's secret comes from ``triloop_sign_in``, which checks the token itself: the
    cookie-signing key alone cannot make a session that records decisions for anyone.
    """
    expected = services.signer.load_login_csrf(request.cookies.get(LOGIN_CSRF_COOKIE))
    if not same_secret(csrf_token, expected):
        raise ProblemError(403, "Forbidden", "the sign-in form expired; reload it and try again")
    try:
        await db.read(principal_for_token, token=token.strip())  # its refusal says why
    except TokenRefused as refused:
        fresh = new_csrf_token()
        response = page(request, "login.html", None, status_code=401, title="Sign in",
                        login_csrf=fresh, next=_safe_next(next),
                        error=f"That token is not valid: {refused}.")
        response.headers["WWW-Authenticate"] = 'Bearer realm="triloop"'
        response.set_cookie(LOGIN_CSRF_COOKIE, services.signer.dump_login_csrf(fresh),
                            max_age=3600, httponly=True, samesite="strict")
        return response
    opened = await db.write(tokens.sign_in, token=token.strip(),
                            lifetime_s=services.signer.session_max_age_s)
    session = ConsoleSession(user=opened.user_name, csrf=new_csrf_token(),
                             token_id=opened.token_id, secret=opened.secret)
    signed_in = RedirectResponse(_safe_next(next), status_code=303)
    signed_in.set_cookie(SESSION_COOKIE, services.signer.dump_session(session),
                        max_age=services.signer.session_max_age_s, httponly=True, samesite="lax",
                        secure=request.url.scheme == "https")
    signed_in.delete_cookie(LOGIN_CSRF_COOKIE)
    return signed_in


@router.post("/logout")
async def logout(request: Request, checked: CsrfChecked, db: SessionDep) -> Response:
    """End the session in the database and forget the cookie."""
    if checked.credential is not None and checked.csrf is not None:  # a console session's
        await db.write(tokens.sign_out, secret=checked.credential)
    response = redirect(request, "/login", notice=("info", "You are signed out."))
    response.delete_cookie(SESSION_COOKIE)
    return response


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request, guard: ConsoleGuard, db: SessionDep) -> Response:
    """Home: what serves production, what waits for this person, then runs and alarms.

    Operators and auditors see production first; stability alarms are the ML engineers'
    business, so only they get the alarm list (others see a count and a link)."""
    waiting = getattr(request.state, "waiting", None)
    if waiting is None:
        waiting = await awaiting_me(guard, db)
    serving = (await db.read(serving_now)
               if await guard.allows("read", "deployment") else None)
    can_runs = await guard.allows("read", "training_run")
    recent = await db.read(runs.list_runs, limit=10, cursor=None) if can_runs else None
    alarms = await db.read(runs.recent_alarms, limit=8) if can_runs else []
    engineer = "ml_engineer" in guard.principal.roles
    return page(request, "overview.html", guard.principal, title="Home", runs=recent,
                alarms=alarms, waiting=waiting, serving=serving, alarms_in_full=engineer)


# What a person may ask of a run in each status: resume only a paused run, pause only one
# that iterates (or is about to), cancel any that has not ended.
CONTROLS: dict[str, tuple[str, ...]] = {
    RunStatus.submitted: ("pause", "cancel"),
    RunStatus.starting: ("pause", "cancel"),
    RunStatus.running: ("pause", "cancel"),
    RunStatus.paused: ("resume", "cancel"),
}
RUN_FILTER = Annotated[str, Query(max_length=200)]
CompareIds = Annotated[str, StringConstraints(max_length=run_compare.MAX_COMPARED * 65)]


def _status_filter(value: str) -> RunStatus | None:
    if not value:  # the form's "any"
        return None
    try:
        return RunStatus(value)
    except ValueError:
        raise invalid(f"status {value!r} is not a run status; use one of "
                      + ", ".join(s.value for s in RunStatus),
                      reasons=[f"status: {value!r} is not a run status"]) from None


@router.get("/runs", response_class=HTMLResponse)
async def runs_page(
    request: Request, guard: ConsoleGuard, db: SessionDep, cursor: CursorParam = None,
    status: RUN_FILTER = "", submitted_by: RUN_FILTER = "",
) -> Response:
    """All training runs, newest first, filtered by status and submitter; tick several to
    compare them."""
    await guard("read", "training_run")
    chosen = _status_filter(status)
    listing = await db.read(runs.list_runs, limit=25, cursor=cursor, status=chosen,
                            submitted_by=submitted_by or None)
    submitters = await db.read(runs.submitters)
    filters = {"status": chosen.value if chosen else "", "submitted_by": submitted_by}
    return page(request, "runs.html", guard.principal, title="Training runs", page_=listing,
                filters=filters, statuses=[s.value for s in RunStatus], submitters=submitters,
                max_compared=run_compare.MAX_COMPARED)


@router.get("/runs/compare", response_class=HTMLResponse)
async def compare_page(
    request: Request, guard: ConsoleGuard, db: SessionDep,
    ids: Annotated[list[CompareIds], Query(max_length=50)] = [],  # noqa: B006
) -> Response:
    """Runs side by side: their labels, how their RUN.yaml configs differ, their series
    overlaid. The selection lives in the URL (``?ids=a,b,c``), so it can be shared."""
    try:
        run_ids = run_compare.parse_run_ids(ids)
    except run_compare.ComparisonRefused as refused:
        return redirect(request, "/runs", notice=("warning", f"Select runs to compare: {refused}."))
    canonical = ",".join(run_ids)
    if ids != [canonical]:  # the list's checkboxes send ids=a&ids=b: one shareable form
        return RedirectResponse(f"/runs/compare?ids={quote(canonical, safe=',')}",
                                status_code=303)
    comparison = await compared(guard, db, run_ids)
    charts = compare_chart_data([(r.id, r.label, [m.model_dump() for m in r.metrics])
                                 for r in comparison.runs])
    colors = {series.id: series.color for series in charts.runs}
    return page(request, "compare.html", guard.principal, title="Compare runs",
                comparison=comparison, chart_data=charts, colors=colors, ids=canonical)


async def _run_view(guard: Guard, db: SessionDep, run_id: str) -> runs.RunDetail:
    await guard("read", "training_run", id=run_id)
    detail = await db.read(runs.run_detail, run_id=run_id)
    if detail is None:
        raise not_found("training run", run_id)
    return detail


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: str, guard: ConsoleGuard, db: SessionDep) -> Response:
    """A run: charts with alarms, controls for its owner, checkpoints."""
    detail = await _run_view(guard, db, run_id)
    live = detail.status not in runs.TERMINAL_STATUSES
    controls = []
    for action in CONTROLS.get(detail.status, ()):
        if await guard.would_allow(action, "training_run", id=run_id,
                                   owner=detail.submitted_by):
            controls.append(action)
    chart_data = run_chart_data([m.model_dump() for m in detail.metrics])
    recent = await db.read(runs.list_runs, limit=25, cursor=None)
    others = [r for r in recent.items if r.id != detail.id]
    return page(request, "run.html", guard.principal, title=f"Run {detail.name or detail.id}",
                run=detail, chart_data=chart_data, controls=controls, live=live,
                others=others,
                no_data_iteration=no_trainable_data_iteration(detail.status_reason))


@router.get("/runs/{run_id}/charts")
async def run_charts_json(run_id: str, guard: ConsoleGuard, db: SessionDep) -> Response:
    """The run's chart data, for live refresh and for overlaying it on another run's page."""
    detail = await _run_view(guard, db, run_id)
    data = run_chart_data([m.model_dump() for m in detail.metrics]).to_json()
    data["run"] = {"id": detail.id, "name": detail.name, "status": detail.status}
    return JSONResponse(data)


@router.post("/runs/{run_id}/{action}")
async def control_run(
    request: Request, run_id: str, action: Literal["pause", "resume", "cancel"],
    principal: CsrfChecked, services: ServicesDep, db: SessionDep,
    reason: Annotated[str, Form(max_length=2000)] = "",
) -> Response:
    """Pause, resume or cancel from the run page."""
    guard = Guard(services, principal, refused_input=await field_with_nul(request))
    await actions.control_run(guard=guard, db=db, services=services, run_id=run_id,
                              action=action, reason=reason)
    return redirect(request, f"/runs/{run_id}",
                    notice=("success", f"Sent {action} to the run; it applies at the next "
                                       "iteration boundary."))
