"""The web service's wiring point: builds its adapters and the FastAPI app (API + console).

``uvicorn web.app:app`` serves it with settings from ``TRILOOP_*``; tests call
``create_app(settings)``. Nothing connects at import, and ``app`` itself is built on
first access, so importing this module never needs a secret. The engine and OPA
client are lazy, and Temporal is reached on first use as ``web@<host>``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from triloop.config import DEV_SESSION_SECRET, Settings, get_settings
from triloop.db import role_engine
from triloop.policy import OpaClient
from triloop.wiring import build_authorizer
from web.api import ROUTERS
from web.api.documented_errors import document_errors, operation_id
from web.api_docs import install_api_docs
from web.audit_outcomes import OutcomeRecorder
from web.auth import CookieSigner
from web.console import install_console
from web.deps import WebServices
from web.orchestration import Orchestrator
from web.problems import PROBLEM_MEDIA_TYPE, install_problem_handlers
from web.request_limits import BodySizeLimit, ValidationPool
from web.webhook_dispatch import webhook_lifespan

DESCRIPTION = (
    "Operators approve promotions and roll back, ML engineers submit and follow runs, "
    "auditors review lineage and verify the audit chain. Authenticate with "
    "`Authorization: Bearer <token>` (`triloop users create NAME --role R`). Every request "
    "is authorized by the policy for the signed-in person; errors are "
    "`application/problem+json`; lists take `?limit=&cursor=` and return `next_cursor`."
)


MIN_SESSION_SECRET_CHARS = 32


class InsecureConfiguration(RuntimeError):
    """The web service refuses to start with these settings; the message names the fix."""


def check_session_secret(settings: Settings) -> None:
    """Refuse the built-in (public) or a short session secret outside the test profile."""
    if settings.gate_profile == "test":
        return
    how = ("set TRILOOP_SESSION_SECRET to a random value of at least "
           f"{MIN_SESSION_SECRET_CHARS} characters (python -c 'import secrets; "
           "print(secrets.token_urlsafe(48))'); `triloop dev up` generates one into "
           ".triloop/secrets/session_secret")
    if settings.session_secret == DEV_SESSION_SECRET:
        raise InsecureConfiguration(
            "the web service will not start with the built-in session secret: anyone who "
            f"has read the source can forge a console session. To fix it, {how}."
        )
    if len(settings.session_secret) < MIN_SESSION_SECRET_CHARS:
        raise InsecureConfiguration(
            f"TRILOOP_SESSION_SECRET is only {len(settings.session_secret)} characters; "
            f"to fix it, {how}."
        )


def build_services(settings: Settings, *, temporal_timeout_s: float = 60.0) -> WebServices:
    """The real adapters: the web role's engine, OPA, Temporal and the cookie signer."""
    return WebServices(
        settings=settings,
        engine=role_engine(settings, "web"),
        authorizer=build_authorizer(settings, "web"),
        hints=OpaClient(settings.opa_url, tokens=settings.opa_tokens("web"),
                        timeout_s=settings.opa_timeout_s),
        orchestrator=Orchestrator(settings, timeout_s=temporal_timeout_s),
        signer=CookieSigner(settings.session_secret, session_max_age_s=settings.session_max_age_s),
        validation=ValidationPool(workers=2, timeout_s=settings.validation_timeout_s),
    )


def create_app(settings: Settings, *, temporal_timeout_s: float = 60.0) -> FastAPI:
    """The FastAPI app for these settings; refuses an unsafe session secret."""
    check_session_secret(settings)
    app = FastAPI(title="triloop", version="0.1.0", description=DESCRIPTION,
                  generate_unique_id_function=operation_id, docs_url=None, redoc_url=None,
                  lifespan=webhook_lifespan)  # the webhook dispatcher runs while served
    app.state.services = build_services(settings, temporal_timeout_s=temporal_timeout_s)
    for router in ROUTERS:
        app.include_router(router)
    install_api_docs(app)
    render_html = install_console(app)
    install_problem_handlers(app, render_html=render_html)
    # Outside the catch-all, so even a 500 is recorded as the outcome of what was allowed.
    app.add_middleware(OutcomeRecorder)
    # Outermost: an oversized body is refused before any of it reaches the app.
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes)
    _problem_only_errors(app)
    return app


# Path and query strings never hold NUL (web.request_fields refuses it): say so in the schema.
NO_NUL_PATTERN = "^[^\\u0000]*$"


def _problem_only_errors(app: FastAPI) -> None:
    """Error responses are documented as problem+json only (FastAPI adds JSON too), and
    string parameters as NUL-free, as the service enforces."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            document_errors(schema, [r for router in ROUTERS for r in router.routes])
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    for status, response in operation.get("responses", {}).items():
                        content = response.get("content", {})
                        if status[0] in "45" and PROBLEM_MEDIA_TYPE in content:
                            content.pop("application/json", None)
                    for parameter in operation.get("parameters", []):
                        _no_nul(parameter.get("schema", {}))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _no_nul(schema: dict[str, Any]) -> None:
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "string" and "pattern" not in option:
            option["pattern"] = NO_NUL_PATTERN


_served: dict[str, FastAPI] = {}


def __getattr__(name: str) -> FastAPI:
    # ``uvicorn web.app:app``: built from the environment on first access only.
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if "app" not in _served:
        _served["app"] = create_app(get_settings())
    return _served["app"]
