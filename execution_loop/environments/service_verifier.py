"""The verifier of a served environment: asks the service for its verdict, from its own process.

Runs in triloop's verifier interpreter (standard library only, ``-I -S``), never in the
agent's process or the worker's: the worker hands it the episode's id, and it asks
``POST /episodes/{id}/verify`` itself. It refuses a verdict signed with a verifier digest
other than the one the contract pins, and turns success into the contract's outcome
reward, so a service can report what happened but never set its own pay.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from execution_loop.environments.base import Outcome


class ServiceVerdictError(RuntimeError):
    """The service gave no usable verdict (unreachable, malformed, wrong verifier)."""


def pay(terms: dict[str, float], success: bool) -> float:
    """The contract's outcome reward for a verdict (what a served environment never sets)."""
    return float(terms["success"] if success else terms.get("failure", 0.0))


def verify(payload: dict[str, Any]) -> Outcome:
    """The service's verdict on one episode, checked against the contract's pin."""
    url = f"{str(payload['url']).rstrip('/')}/episodes/{payload['episode_id']}/verify"
    request = urllib.request.Request(url, data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=float(payload["timeout_s"])) as reply:
            verdict = json.loads(reply.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ServiceVerdictError(f"environment service {url} gave no verdict: {exc}") from exc
    if not isinstance(verdict, dict) or not isinstance(verdict.get("success"), bool):
        raise ServiceVerdictError(f"environment service {url} sent no boolean 'success'")
    if verdict.get("verifier_digest") != payload["verifier_digest"]:
        raise ServiceVerdictError(
            f"environment service {url} verified with {verdict.get('verifier_digest')!r}, "
            f"not the pinned verifier {payload['verifier_digest']}"
        )
    success = verdict["success"]
    reward = pay(payload["reward"], success)
    given = verdict.get("details")
    details: dict[str, Any] = given if isinstance(given, dict) else {}
    return Outcome(success=success, reward=float(reward),
                   details={**details, "verified_by": "service"})
