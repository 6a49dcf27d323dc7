"""Builds the real adapters a service needs; called only from each service's wiring point."""

from __future__ import annotations

from triloop.audit import DatabaseAuditSink
from triloop.config import ServiceName, Settings
from triloop.db import role_engine
from triloop.policy import Authorizer, OpaClient


def build_authorizer(settings: Settings, service: ServiceName) -> Authorizer:
    """An ``Authorizer`` that asks the configured OPA and audits with the service's role."""
    opa = OpaClient(settings.opa_url, tokens=settings.opa_tokens(service),
                    timeout_s=settings.opa_timeout_s)
    return Authorizer(opa, DatabaseAuditSink(role_engine(settings, service)))
