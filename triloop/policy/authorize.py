"""``authorize()``: ask OPA, record every decision through the audit sink, raise when denied."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from triloop.policy.model import Actor, AuditSink, Decision, PolicyDenied, Resource
from triloop.policy.opa import OpaClient


class Authorizer:
    """``authorize()``: ask OPA, record the decision through the sink, raise when denied.

    The sink runs for every decision, allowed or denied; if it fails, its error
    propagates and the action does not happen (no audit, no action).
    """

    def __init__(self, opa: OpaClient, audit: AuditSink) -> None:
        self._opa = opa
        self._audit = audit

    def authorize(
        self,
        actor: Actor,
        action: str,
        resource: Resource,
        *,
        context: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Return the allowing decision, or raise ``PolicyDenied`` after auditing the denial."""
        decision = self._opa.decide(actor, action, resource, context)
        self._audit(actor, action, resource, decision, context)
        if not decision.allow:
            raise PolicyDenied(actor, action, resource, decision)
        return decision

    async def authorize_async(
        self,
        actor: Actor,
        action: str,
        resource: Resource,
        *,
        context: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Async ``authorize``: query and (blocking) sink together in one worker thread."""
        return await asyncio.to_thread(self.authorize, actor, action, resource, context=context)
