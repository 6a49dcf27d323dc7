"""The OPA client fails closed, says why, and ``Authorizer`` audits every decision.

Failure paths run against a real OPA that is then stopped, an unused port, and a
tiny loopback HTTP server that answers garbage (a collaborator, not the subject).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from triloop.config import Settings
from triloop.devstack.processes import free_port, stop_recorded
from triloop.devstack.servers import repo_root, start_opa
from triloop.policy import (
    Actor,
    Authorizer,
    Decision,
    OpaClient,
    PolicyDenied,
    Resource,
    acting_for,
    decision_from_response,
    policy_input,
)

OPERATOR = Actor("web", "olga", ("operator",))
PROMOTION = Resource("promotion", "p-1", attrs={"submitted_by": "sam", "audited_by": "ada"})


def _body(doc: object) -> bytes:
    return json.dumps(doc).encode()


# --- decision_from_response: every shape OPA could answer with -----------------------


def test_well_formed_answer_keeps_id_and_bundle_revision() -> None:
    doc = {
        "decision_id": "d-1",
        "provenance": {"version": "1.22.3", "bundles": {"policies": {"revision": "abc"}}},
        "result": {"allow": True, "reasons": ["role operator may approve promotion"]},
    }
    assert decision_from_response(200, _body(doc)) == Decision(
        True, ("role operator may approve promotion",), "d-1", "abc"
    )


def test_revision_of_several_bundles_and_legacy_field() -> None:
    bundles = {"b": {"revision": "2"}, "a": {"revision": "1"}}
    result = {"allow": False, "reasons": ["x"]}
    several = decision_from_response(
        200, _body({"provenance": {"bundles": bundles}, "result": result})
    )
    assert several.policy_revision == "a=1,b=2"
    legacy = decision_from_response(
        200, _body({"provenance": {"revision": "r9"}, "result": result})
    )
    assert legacy.policy_revision == "r9"
    plain = decision_from_response(200, _body({"provenance": {"version": "1"}, "result": result}))
    assert plain.policy_revision is None


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (200, b"<html>not json</html>", "not JSON"),
        (200, b"[1, 2]", "not an object"),
        (502, b"Bad Gateway", "HTTP 502"),
        (500, _body({"code": "internal_error", "message": "boom"}), "HTTP 500: boom"),
        (400, _body({"code": "invalid_parameter"}), "HTTP 400: invalid_parameter"),
        (200, _body({"decision_id": "d-2"}), "no result for data.triloop.authz.decision"),
        (200, _body({"result": True}), "no boolean 'allow'"),
        (200, _body({"result": {"allow": "yes", "reasons": []}}), "no boolean 'allow'"),
        (200, _body({"result": {"allow": True}}), "'reasons' is not a list of strings"),
        (200, _body({"result": {"allow": True, "reasons": [1]}}), "not a list of strings"),
    ],
)
def test_unexpected_answers_deny_with_a_reason(status: int, body: bytes, reason: str) -> None:
    decision = decision_from_response(status, body)
    assert decision.allow is False
    assert len(decision.reasons) == 1
    assert decision.reasons[0].startswith("failed closed: ")
    assert reason in decision.reasons[0]


def test_undefined_decision_keeps_the_decision_id() -> None:
    assert decision_from_response(200, _body({"decision_id": "d-3"})).decision_id == "d-3"


def test_denial_without_reasons_still_says_why() -> None:
    decision = decision_from_response(200, _body({"result": {"allow": False, "reasons": []}}))
    assert decision.allow is False
    assert decision.reasons == ("the policy denied without giving a reason",)


# --- the input document -------------------------------------------------------------------


def test_policy_input_shape_and_delegation_context() -> None:
    doc = policy_input(Actor("governance"), "approve", PROMOTION, acting_for(OPERATOR, reason="ok"))
    assert doc == {
        "actor": {"service": "governance", "roles": []},
        "action": "approve",
        "resource": {
            "kind": "promotion",
            "id": "p-1",
            "attrs": {"submitted_by": "sam", "audited_by": "ada"},
        },
        "context": {"on_behalf_of": {"user": "olga", "roles": ["operator"]}, "reason": "ok"},
    }
    with pytest.raises(ValueError, match="needs a person"):
        acting_for(Actor("learning"))


def test_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="http://"):
        OpaClient("127.0.0.1:8181")


# --- transport failures ---------------------------------------------------------------------


def test_unused_port_denies_as_unreachable() -> None:
    with OpaClient(f"http://127.0.0.1:{free_port()}", timeout_s=1.0) as client:
        decision = client.decide(OPERATOR, "approve", PROMOTION)
    assert decision.allow is False
    assert "unreachable" in decision.reasons[0]
    assert decision.decision_id is None


async def test_unused_port_denies_as_unreachable_async() -> None:
    client = OpaClient(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    decision = await client.adecide(OPERATOR, "approve", PROMOTION)
    client.close()
    assert decision.allow is False
    assert "unreachable" in decision.reasons[0]


class _GarbageHandler(BaseHTTPRequestHandler):
    """Answers as ``server.behaviour`` says: garbage, an error, silence or a hang-up."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        behaviour = self.server.behaviour  # type: ignore[attr-defined]
        if behaviour == "hang_up":
            self.close_connection = True
            return
        if behaviour == "slow":
            time.sleep(1.0)
        status, body = {
            "garbage": (200, b"\x00\x01 definitely not json"),
            "error": (503, b'{"code": "unavailable", "message": "policies reloading"}'),
            "slow": (200, b'{"result": {"allow": true, "reasons": ["too late"]}}'),
            "undefined": (200, b'{"decision_id": "d-9"}'),
        }[behaviour]
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Silence the default stderr access log."""


@pytest.fixture()
def garbage_server() -> Iterator[ThreadingHTTPServer]:
    """A loopback HTTP server whose answers a test chooses."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _GarbageHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        ("garbage", "not JSON"),
        ("error", "HTTP 503: policies reloading"),
        ("slow", "did not answer within 0.3s"),
        ("hang_up", "RemoteProtocolError"),
        ("undefined", "no result for data.triloop.authz.decision"),
    ],
)
async def test_bad_servers_deny_sync_and_async(
    garbage_server: ThreadingHTTPServer, behaviour: str, reason: str
) -> None:
    garbage_server.behaviour = behaviour  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{garbage_server.server_address[1]}"
    client = OpaClient(url, timeout_s=0.3)
    sync_decision = await asyncio.to_thread(client.decide, OPERATOR, "approve", PROMOTION)
    async_decision = await client.adecide(OPERATOR, "approve", PROMOTION)
    client.close()
    for decision in (sync_decision, async_decision):
        assert decision.allow is False
        assert reason in decision.reasons[0], decision.reasons


def test_real_opa_then_stopped_denies(tmp_path: Path) -> None:
    port = free_port()
    proc = start_opa(
        policies=repo_root() / "policies", port=port, run_dir=tmp_path, log_dir=tmp_path,
        secrets_dir=tmp_path / "secrets",
    )
    client = OpaClient(f"http://127.0.0.1:{port}", timeout_s=1.0,
                       tokens=Settings(home=tmp_path).opa_tokens())
    try:
        before = client.decide(OPERATOR, "approve", PROMOTION)
        assert before.allow is True
        assert before.decision_id  # decision logging is on, so OPA issued an id
    finally:
        stop_recorded(proc.pid_path)
    after = client.decide(OPERATOR, "approve", PROMOTION)
    client.close()
    assert after.allow is False
    assert "failed closed" in after.reasons[0]


# --- Authorizer ---------------------------------------------------------------------------


class _StubOpa(OpaClient):
    """Answers a fixed decision without a server: the subject here is the Authorizer."""

    def __init__(self, decision: Decision) -> None:
        super().__init__("http://127.0.0.1:9")
        self.fixed = decision

    def decide(self, *args: Any, **kwargs: Any) -> Decision:
        return self.fixed


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Actor, str, Resource, Decision, Mapping[str, Any] | None]] = []
        self.threads: list[int] = []

    def __call__(
        self,
        actor: Actor,
        action: str,
        resource: Resource,
        decision: Decision,
        context: Mapping[str, Any] | None,
    ) -> None:
        self.calls.append((actor, action, resource, decision, context))
        self.threads.append(threading.get_ident())


ALLOW = Decision(True, ("role operator may approve promotion",), "d-a", "rev")
DENY = Decision(False, ("separation of duties: nope",), "d-d", "rev")


def test_allowed_decision_is_recorded_and_returned() -> None:
    sink = _Recorder()
    context = {"request_id": "r-1"}
    assert (
        Authorizer(_StubOpa(ALLOW), sink).authorize(OPERATOR, "approve", PROMOTION, context=context)
        == ALLOW
    )
    assert sink.calls == [(OPERATOR, "approve", PROMOTION, ALLOW, context)]


def test_denied_decision_is_recorded_then_raised() -> None:
    sink = _Recorder()
    with pytest.raises(PolicyDenied) as raised:
        Authorizer(_StubOpa(DENY), sink).authorize(OPERATOR, "approve", PROMOTION)
    assert sink.calls == [(OPERATOR, "approve", PROMOTION, DENY, None)]
    assert raised.value.decision == DENY
    message = str(raised.value)
    for part in ("olga (operator) via web", "approve", "promotion p-1", "separation of duties"):
        assert part in message


def test_failing_sink_stops_the_action() -> None:
    def broken_sink(*_: object) -> None:
        raise RuntimeError("audit log unavailable")

    with pytest.raises(RuntimeError, match="audit log unavailable"):
        Authorizer(_StubOpa(ALLOW), broken_sink).authorize(OPERATOR, "approve", PROMOTION)


async def test_async_authorize_records_in_a_worker_thread() -> None:
    sink = _Recorder()
    authorizer = Authorizer(_StubOpa(DENY), sink)
    with pytest.raises(PolicyDenied):
        await authorizer.authorize_async(OPERATOR, "approve", PROMOTION)
    authorizer_allow = Authorizer(_StubOpa(ALLOW), sink)
    assert await authorizer_allow.authorize_async(OPERATOR, "approve", PROMOTION) == ALLOW
    assert [call[3] for call in sink.calls] == [DENY, ALLOW]
    assert threading.get_ident() not in sink.threads
