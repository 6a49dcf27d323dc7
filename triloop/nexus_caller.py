"""The check every Nexus handler makes before it acts: who calls, and may they ask this?"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import nexusrpc
from nexusrpc.handler import StartOperationContext

from triloop.config import LOOPS, Settings
from triloop.nexus_api import caller_namespace
from triloop.policy import Actor, Authorizer, PolicyDenied, Resource

UNKNOWN_CALLER = "unknown"


class NexusCallerCheck:
    """Names the calling loop from the server's link, then asks OPA (audited) for it."""

    def __init__(self, settings: Settings, *, server: Actor, authorizer: Authorizer) -> None:
        self._loops = {settings.temporal_namespace(loop): loop for loop in LOOPS}
        self._server = server
        self._authorizer = authorizer

    def caller(self, ctx: StartOperationContext) -> str:
        """The calling loop, or ``unknown`` when the link names no loop's namespace."""
        namespace = caller_namespace(ctx.inbound_links)
        return self._loops.get(namespace or "", UNKNOWN_CALLER)

    async def admit(self, ctx: StartOperationContext, *, purpose: str,
                    attrs: Mapping[str, Any] | None = None) -> str:
        """The calling loop if OPA lets it ask for ``ctx.operation``; else a refusal.

        The refusal is a non-retryable ``UNAUTHORIZED`` handler error: the calling workflow
        sees it at once, and the denial is already in the audit log.
        """
        caller = self.caller(ctx)
        resource = Resource("nexus_operation", id=ctx.operation,
                            attrs={"caller": caller, "purpose": purpose, **(attrs or {})})
        try:
            await self._authorizer.authorize_async(self._server, "serve", resource)
        except PolicyDenied as denied:
            raise nexusrpc.HandlerError(
                f"{self._server.service} refuses {ctx.operation} ({purpose}) to {caller}: "
                f"{denied}", type=nexusrpc.HandlerErrorType.UNAUTHORIZED,
                retryable_override=False) from denied
        return caller
