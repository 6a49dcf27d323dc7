"""Errors as RFC 9457 problem documents (``application/problem+json``).

Routes raise ``ProblemError`` (or let ``PolicyDenied`` through); the handlers here
turn every failure into a problem with a message that says what was wrong. The
catch-all handler logs the traceback and still answers with a problem, so no
input ever yields a bare stack trace.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from triloop.db import CREDENTIAL_REFUSED, INSUFFICIENT_PRIVILEGE, LOCK_NOT_AVAILABLE, sqlstate
from triloop.policy import PolicyDenied

log = logging.getLogger("triloop.web")

PROBLEM_MEDIA_TYPE = "application/problem+json"
_TYPE_BASE = "https://triloop.dev/problems/"


class Problem(BaseModel):
    """An error: what kind, a short title, the HTTP status and what exactly was wrong."""

    type: str = Field(description="URI naming the kind of problem")
    title: str = Field(description="Short summary of the kind of problem")
    status: int = Field(description="HTTP status code")
    detail: str = Field(description="What was wrong with this request, and what to do")
    reasons: list[str] | None = Field(
        default=None, description="The policy's reasons (403) or each invalid field (422)"
    )


# Echoed input is cut short: an error about a 10 MB field must not be 10 MB long.
MAX_DETAIL_CHARS = 2000
MAX_REASON_CHARS = 500
MAX_REASONS = 50


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters not shown)"


class ProblemError(Exception):
    """Raised by routes and actions; rendered as a problem document."""

    def __init__(
        self, status: int, title: str, detail: str, *, reasons: list[str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.reasons = reasons
        self.headers = headers

    def problem(self) -> Problem:
        """The problem document, with echoed values and long reason lists cut short."""
        slug = self.title.lower().replace(" ", "-")
        reasons = None
        if self.reasons is not None:
            reasons = [shorten(r, MAX_REASON_CHARS) for r in self.reasons[:MAX_REASONS]]
            if len(self.reasons) > MAX_REASONS:
                reasons.append(f"… and {len(self.reasons) - MAX_REASONS} more problems")
        return Problem(
            type=_TYPE_BASE + slug, title=self.title, status=self.status,
            detail=shorten(self.detail, MAX_DETAIL_CHARS), reasons=reasons,
        )


def not_found(kind: str, key: str) -> ProblemError:
    """404 for an id that names nothing."""
    return ProblemError(404, "Not found", f"no {kind} with id {key!r}")


def conflict(detail: str) -> ProblemError:
    """409: the request is valid but the resource's state does not allow it."""
    return ProblemError(409, "Conflict", detail)


def invalid(detail: str, reasons: list[str] | None = None) -> ProblemError:
    """422: the input is well-formed but not acceptable."""
    return ProblemError(422, "Invalid input", detail, reasons=reasons)


def unauthenticated(detail: str, *, invalid_token: bool = False) -> ProblemError:
    """401: no valid credentials, with the ``WWW-Authenticate: Bearer`` challenge (RFC 6750)."""
    challenge = 'Bearer realm="triloop"'
    if invalid_token:
        description = shorten(detail, 200).replace("\\", "").replace('"', "'")
        challenge += f', error="invalid_token", error_description="{description}"'
    return ProblemError(401, "Unauthenticated", detail, headers={"WWW-Authenticate": challenge})


def denied(error: PolicyDenied) -> ProblemError:
    """403 carrying the policy's reasons."""
    reasons = list(error.decision.reasons)
    target = error.resource.kind + (f" {error.resource.id}" if error.resource.id else "")
    detail = f"the policy does not let you {error.action} {target}: " + (
        "; ".join(reasons) or "no reason given"
    )
    return ProblemError(403, "Forbidden", detail, reasons=reasons)


def problem_response(problem: Problem, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON response with the problem media type."""
    return JSONResponse(
        problem.model_dump(exclude_none=True), status_code=problem.status,
        media_type=PROBLEM_MEDIA_TYPE, headers=dict(headers) if headers else None,
    )


def as_problem(exc: Exception) -> ProblemError:
    """Any exception as a ``ProblemError`` (500 only for a genuine bug)."""
    if isinstance(exc, ProblemError):
        return exc
    if isinstance(exc, PolicyDenied):
        return denied(exc)
    if isinstance(exc, RequestValidationError):
        reasons = [_describe(error) for error in exc.errors()]
        return invalid("the request does not match the API schema", reasons)
    if isinstance(exc, StarletteHTTPException):
        titles = {400: "Bad request", 401: "Unauthenticated", 403: "Forbidden", 404: "Not found",
                  405: "Method not allowed", 409: "Conflict", 413: "Content too large",
                  422: "Invalid input"}
        title = titles.get(exc.status_code, "HTTP error")
        return ProblemError(exc.status_code, title, str(exc.detail),
                            headers=dict(exc.headers or {}) or None)
    refusal = _database_refusal(exc)
    if refusal is not None:
        return refusal
    if isinstance(exc, OperationalError):
        return ProblemError(503, "Database unavailable",
                            "PostgreSQL cannot be reached right now; try again shortly")
    if isinstance(exc, IntegrityError):
        return ProblemError(409, "Conflict", "the change conflicts with existing data: "
                            + _first_line(exc.orig))
    if isinstance(exc, DataError):
        return invalid("a value cannot be stored or compared by the database (for example a NUL "
                       "character or a number out of range): " + _first_line(exc.orig))
    return ProblemError(
        500, "Internal error",
        "the server failed on this request; the error is logged with its traceback",
    )


def _database_refusal(exc: Exception) -> ProblemError | None:
    """A database error that is an answer, not an outage: a lock timeout, a refused
    credential or privilege (each would otherwise read "PostgreSQL cannot be reached")."""
    state = sqlstate(exc)
    if state is None:
        return None
    cause = _first_line(getattr(exc, "orig", exc))
    if state == LOCK_NOT_AVAILABLE:
        return ProblemError(503, "Database lock timeout",
                            f"lock timeout: a database lock was not granted in time ({cause});"
                            " nothing was changed. Try again; if it persists, a transaction is"
                            " holding the lock (pg_stat_activity shows which)",
                            headers={"Retry-After": "5"})
    if state == CREDENTIAL_REFUSED:
        return unauthenticated(f"the database refused this request's credential: {cause};"
                               " sign in again", invalid_token=True)
    if state == INSUFFICIENT_PRIVILEGE:
        return ProblemError(403, "Forbidden", f"the database refused the change: {cause}")
    return None


def _first_line(error: object) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _describe(error: Any) -> str:
    location = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    return f"{location or '(body)'}: {error.get('msg', 'invalid')}"


# Renders a problem for one request; the console installs an HTML renderer for its pages.
ProblemRenderer = Any


def install_problem_handlers(app: FastAPI, render_html: ProblemRenderer | None = None) -> None:
    """Route every error through ``as_problem``; console pages get HTML instead of JSON."""

    async def handle(request: Request, exc: Exception) -> Response:
        error = as_problem(exc)
        if error.status >= 500:
            log.exception("unhandled error on %s %s", request.method, request.url.path,
                          exc_info=exc)
        if error.status == 405:
            error.headers = {**(error.headers or {}), "Allow": allowed_methods(request)}
        if render_html is not None and wants_html(request):
            response: Response = await render_html(request, error)
            return response
        return problem_response(error.problem(), error.headers)

    for exc_type in (ProblemError, PolicyDenied, RequestValidationError,
                     StarletteHTTPException):
        app.add_exception_handler(exc_type, handle)
    # Outermost: a bug anywhere still answers with a problem and is never re-raised
    # into the server (Starlette's own Exception handler re-raises after answering).
    app.add_middleware(CatchAllMiddleware, render=handle)


class CatchAllMiddleware:
    """ASGI middleware: any exception that escaped the app becomes a logged 500 problem."""

    def __init__(self, app: ASGIApp, render: Any) -> None:
        self.app = app
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; answer a problem if it raises before its response started."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # the catch-all: log, answer, never re-raise
            if started:
                log.exception("error after the response started", exc_info=exc)
                return
            response = await self.render(Request(scope, receive), exc)
            await response(scope, receive, send)


HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> str:
    """Every method some route of the app accepts on this path (the 405's ``Allow``)."""
    methods = {
        method for method in HTTP_METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL
               for route in request.app.routes)
    }
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def wants_html(request: Request) -> bool:
    """Console pages (not ``/api``) answer errors with HTML for browsers."""
    path = request.url.path
    if path.startswith(("/api", "/openapi", "/docs", "/healthz")):
        return False
    return "text/html" in request.headers.get("accept", "") or request.method == "POST"
