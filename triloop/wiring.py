"""Builds the real adapters a service needs; called only from each service's wiring point."""

from __future__ import annotations

from sqlalchemy import Engine

from triloop.audit import DatabaseAuditSink
from triloop.config import ServiceName, Settings
from triloop.db import role_engine
from triloop.policy import Authorizer, OpaClient


def build_authorizer(settings: Settings, service: ServiceName,
                     audit_engine: Engine | None = None) -> Authorizer:
    """An ``Authorizer`` that asks the configured OPA and audits with the service's role
    (or ``audit_engine``: the owner's, for the server's own CLI commands)."""
    opa = OpaClient(settings.opa_url, tokens=settings.opa_tokens(service),
                    timeout_s=settings.opa_timeout_s)
    return Authorizer(opa, DatabaseAuditSink(audit_engine or role_engine(settings, service)))
