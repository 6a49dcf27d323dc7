"""The OPA client: one decision query over HTTP, sync and async, failing closed.

``OpaClient`` asks ``POST {url}/v1/data/triloop/authz/decision?provenance=true`` and turns
the answer into a ``Decision``. OPA issues the ``decision_id`` only while decision logging
is on (``--set decision_logs.console=true``); the policy revision is the bundle revision
in ``provenance`` (present when OPA serves the policies as a bundle, e.g. built with
``opa build --revision``; plain ``--watch`` folders have none, so it is then ``None``).

Fail closed: a refused connection, a timeout, an HTTP error, a body that is not JSON, a
missing ``result`` (undefined decision) or a result that is not ``{allow: bool,
reasons: [str]}`` all become a *deny* whose reason says which. Nothing is cached, so a
policy change applies to the next call.

Why httpx and not opa-python-client: its sync client is built on requests/urllib3 and
its async client on aiohttp and aiofiles (two more HTTP stacks beside the httpx triloop
already uses); ``query_rule`` cannot pass ``provenance=true``; ``check_permission`` first
fetches the policy source to find the rule, an extra round trip per decision; and it
raises on HTTP errors where we need a reasoned deny. One ``httpx.Client`` (and one
``httpx.AsyncClient`` per event loop) per ``OpaClient`` keeps connections alive, which
is most of the latency budget on loopback.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import httpx

from triloop.policy.model import Actor, Decision, Resource, policy_input

DECISION_PATH = "/v1/data/triloop/authz/decision"


def _deny(reason: str, decision_id: str | None = None, revision: str | None = None) -> Decision:
    return Decision(False, (f"failed closed: {reason}",), decision_id, revision)


def _revision(provenance: Any) -> str | None:
    """The bundle revision(s) from OPA's provenance, ``None`` when OPA reports none."""
    if not isinstance(provenance, dict):
        return None
    bundles = provenance.get("bundles")
    if isinstance(bundles, dict) and bundles:
        revisions = {
            name: str(info.get("revision", ""))
            for name, info in bundles.items()
            if isinstance(info, dict)
        }
        if len(revisions) == 1:
            return next(iter(revisions.values())) or None
        return ",".join(f"{name}={rev}" for name, rev in sorted(revisions.items())) or None
    revision = provenance.get("revision")
    return str(revision) if revision else None


def decision_from_response(status: int, body: bytes) -> Decision:
    """Turn OPA's HTTP answer into a ``Decision``, denying on anything unexpected."""
    try:
        doc = json.loads(body)
    except ValueError:
        if status != 200:
            return _deny(f"OPA answered HTTP {status}")
        return _deny("OPA answered with a body that is not JSON")
    if not isinstance(doc, dict):
        return _deny(f"OPA answered HTTP {status} with JSON that is not an object")
    if status != 200:
        message = doc.get("message") or doc.get("code") or "no message"
        return _deny(f"OPA answered HTTP {status}: {message}")
    decision_id = doc.get("decision_id") if isinstance(doc.get("decision_id"), str) else None
    revision = _revision(doc.get("provenance"))
    if "result" not in doc:
        return _deny(
            "OPA has no result for data.triloop.authz.decision (undefined: are the "
            "policies loaded?)",
            decision_id,
            revision,
        )
    result = doc["result"]
    if not isinstance(result, dict) or not isinstance(result.get("allow"), bool):
        return _deny("OPA's decision is malformed: no boolean 'allow'", decision_id, revision)
    reasons = result.get("reasons")
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        return _deny(
            "OPA's decision is malformed: 'reasons' is not a list of strings", decision_id, revision
        )
    if not result["allow"] and not reasons:
        reasons = ["the policy denied without giving a reason"]
    return Decision(result["allow"], tuple(reasons), decision_id, revision)


def _transport_failure(exc: Exception, url: str, timeout_s: float) -> Decision:
    if isinstance(exc, httpx.TimeoutException):
        return _deny(f"OPA at {url} did not answer within {timeout_s:g}s ({type(exc).__name__})")
    if isinstance(exc, httpx.ConnectError):
        return _deny(f"OPA at {url} is unreachable (connection refused or failed: {exc})")
    return _deny(f"the request to OPA at {url} failed ({type(exc).__name__}: {exc})")


class OpaClient:
    """Queries the triloop decision on an OPA server; sync and async, one pool each."""

    def __init__(self, url: str, *, timeout_s: float = 2.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"OPA url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._endpoint = f"{self.url}{DECISION_PATH}"
        self._params = {"provenance": "true"}
        self._headers = {"content-type": "application/json"}
        self._client = httpx.Client(timeout=timeout_s)
        self._aclient: httpx.AsyncClient | None = None
        self._aclient_loop: asyncio.AbstractEventLoop | None = None

    def _body(
        self, actor: Actor, action: str, resource: Resource, context: Mapping[str, Any] | None
    ) -> bytes:
        # default=str: ids and timestamps in attrs (UUID, datetime) travel as strings.
        doc = {"input": policy_input(actor, action, resource, context)}
        return json.dumps(doc, default=str).encode()

    def decide(
        self,
        actor: Actor,
        action: str,
        resource: Resource,
        context: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Ask OPA; any failure is a deny with its reason."""
        body = self._body(actor, action, resource, context)
        try:
            response = self._client.post(
                self._endpoint, content=body, params=self._params, headers=self._headers
            )
        except httpx.HTTPError as exc:
            return _transport_failure(exc, self.url, self.timeout_s)
        return decision_from_response(response.status_code, response.content)

    def _async_client(self) -> httpx.AsyncClient:
        # An AsyncClient's pool belongs to the loop it first ran on; a new loop gets its own.
        loop = asyncio.get_running_loop()
        if self._aclient is None or self._aclient_loop is not loop:
            self._aclient = httpx.AsyncClient(timeout=self.timeout_s)
            self._aclient_loop = loop
        return self._aclient

    async def adecide(
        self,
        actor: Actor,
        action: str,
        resource: Resource,
        context: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Async ``decide``."""
        body = self._body(actor, action, resource, context)
        try:
            response = await self._async_client().post(
                self._endpoint, content=body, params=self._params, headers=self._headers
            )
        except httpx.HTTPError as exc:
            return _transport_failure(exc, self.url, self.timeout_s)
        return decision_from_response(response.status_code, response.content)

    def __enter__(self) -> OpaClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the sync pool (the async one closes with ``aclose``)."""
        self._client.close()

    async def aclose(self) -> None:
        """Close both pools."""
        self._client.close()
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None
