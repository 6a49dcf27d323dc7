"""The outcome of each allowed action, audited next to its authorization.

The policy's ``allow`` says a person may try; it does not say what happened. An approve
that the promotion workflow then refused (409) used to read as a plain ``approve ...
allow``. This ASGI middleware appends, for each allowed action other than a read, an
event with the same action and resource, ``decision_id`` set to the authorization's, and
the payload ``{"outcome": "succeeded" | "refused" | "failed", "status": ..., "detail":
...}``. A refused action (4xx: a loop, the database or a rule refused what the policy
allowed) is a ``deny`` on the person's own row, with ``reasons`` saying why; anything else
is a ``record``. The row names the person, so the database checks the credential of this
request (migration 0020). It is written before the response leaves, so whoever sees the
answer can already read its outcome in the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from triloop.audit import record_event
from web.deps import Guard

log = logging.getLogger("triloop.web")
MAX_DETAIL_CHARS = 500


def outcome_word(status: int) -> str:
    """succeeded (2xx/3xx), refused (4xx) or failed (5xx)."""
    if status >= 500:
        return "failed"
    return "refused" if status >= 400 else "succeeded"


def record_outcomes(guard: Guard, status: int, detail: str | None) -> None:
    """Append one outcome event per allowed action of the request (blocking)."""
    outcome = outcome_word(status)
    for allowed in guard.authorized:
        payload: dict[str, Any] = {"outcome": outcome, "status": status}
        if detail:
            payload["detail"] = detail[:MAX_DETAIL_CHARS]
        if outcome == "refused":
            payload["reasons"] = [payload.get("detail") or f"refused with HTTP {status}"]
        record_event(guard.engine, actor=guard.principal.actor.to_input(),
                     action=allowed.action, resource=allowed.resource.to_input(),
                     payload=payload, decision_id=allowed.decision_id,
                     decision="deny" if outcome == "refused" else "record",
                     credential=guard.principal.credential)


class OutcomeRecorder:
    """ASGI middleware: audit the outcome of the request's allowed actions."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; before its answer leaves, record the outcomes."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []

        def guard() -> Guard | None:
            found = scope.get("state", {}).get("guard")
            return found if isinstance(found, Guard) and found.authorized else None

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                if guard() is None:
                    await send(message)
                elif message["status"] < 400:
                    await self._record(guard(), message["status"], None)
                    await send(message)
                else:
                    held.append(message)  # wait for the problem's detail
                return
            if held and message["type"] == "http.response.body":
                held.append(message)
                if message.get("more_body"):
                    return
                start, *bodies = held
                held.clear()
                body = b"".join(m.get("body", b"") for m in bodies)
                await self._record(guard(), start["status"], _detail(body))
                await send(start)
                for part in bodies:
                    await send(part)
                return
            await send(message)

        await self.app(scope, receive, recording_send)

    async def _record(self, guard: Guard | None, status: int, detail: str | None) -> None:
        if guard is None:
            return
        try:
            await asyncio.to_thread(record_outcomes, guard, status, detail)
        except Exception:  # the action is done: answer it, and say loudly the record failed
            log.exception("could not audit the outcome (%s) of %s", status,
                          [a.action for a in guard.authorized])


def _detail(body: bytes) -> str | None:
    try:
        problem = json.loads(body)
    except ValueError:
        return None
    return str(problem.get("detail") or "") or None if isinstance(problem, dict) else None
