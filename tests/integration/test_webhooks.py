"""Webhooks (issue 28, item 11): operators configure them through the API; a local receiver
gets each event kind, signed, from rows the owning services' code wrote; failed deliveries
are retried with backoff, given up at last, and every attempt is in the audit log."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import typer
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from governance_loop.activities.promotion import PromotionActivities
from governance_loop.activities.rollback import RollbackActivities
from governance_loop.contracts import GateRecord, MarkPromotion
from governance_loop.durations import PromotionTiming
from learning_loop.activities.run_state import RunActivities
from learning_loop.contracts import RunStatusInput
from tests.factories import make_checkpoint, make_run, record_decision, uid
from tests.factories_web import Person, assert_problem, make_deployment, make_promotion
from triloop.audit import record_event
from triloop.config import Settings
from triloop.db import session_scope
from triloop.notifications.delivery import DeliveryPolicy
from triloop.notifications.dispatcher import Dispatcher
from triloop.notifications.events import EventKind
from triloop.notifications.outbox import enqueue_events
from triloop.notifications.signing import DELIVERY_HEADER, EVENT_HEADER, SignatureInvalid, verify
from triloop.policy import Actor
from triloop.wiring import build_authorizer
from triloop.workflow_api import RollbackInput
from web.cli_webhooks import webhooks_app

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

SECRET = "receiver-shared-secret-" + "x" * 16


@dataclass
class Received:
    """One request the receiver got, and whether its signature held."""

    event: str
    delivery_id: str
    body: dict[str, Any]
    signature_error: str | None


@dataclass
class Receiver:
    """A local HTTP receiver that verifies each delivery's signature with ``SECRET``."""

    url: str
    got: list[Received] = field(default_factory=list)
    fail_next: int = 0  # answer this many requests with 500 first

    def subjects(self, *ids: str) -> list[Received]:
        return [r for r in self.got if r.body["subject"]["id"] in ids]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            me = state["receiver"]
            try:
                verify(secret=SECRET, body=body, headers=dict(self.headers), now=time.time())
                error = None
            except SignatureInvalid as invalid:
                error = str(invalid)
            me.got.append(Received(self.headers[EVENT_HEADER], self.headers[DELIVERY_HEADER],
                                   json.loads(body), error))
            failing = me.fail_next > 0
            me.fail_next -= 1 if failing else 0
            self.send_response(500 if failing else 204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            del args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state["receiver"] = Receiver(f"http://127.0.0.1:{server.server_address[1]}/hooks")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state["receiver"]
    server.shutdown()
    server.server_close()


@pytest.fixture
def web_engine(role_engine: Callable[[str], Engine]) -> Engine:
    return role_engine("web")


def _dispatcher(engine: Engine, **policy: Any) -> Dispatcher:
    return Dispatcher(engine, DeliveryPolicy(**{"retry_base_s": 0.0, **policy}))


def _audited(owner: Engine, webhook_id: str, key: str | None = None) -> list[dict[str, Any]]:
    """The attempts audited for a webhook (of one event's key)."""
    with owner.connect() as conn:
        rows = conn.execute(text(
            "SELECT db_role, payload FROM audit_event WHERE action = 'deliver_webhook' "
            "AND resource->>'id' = :w ORDER BY seq"), {"w": webhook_id}).all()
    attempts = [{"db_role": r[0], **r[1]} for r in rows]
    return [a for a in attempts if key is None or a["event_key"] == key]


async def _webhook(api: httpx.AsyncClient, operator: Person, url: str,
                   events: list[str] | None = None) -> str:
    body: dict[str, Any] = {"url": url, "secret": SECRET, "description": "on-call"}
    if events is not None:
        body["events"] = events
    made = await api.post("/api/webhooks", headers=operator.headers, json=body)
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


async def test_only_an_operator_configures_webhooks_and_the_secret_is_shown_once(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    body = {"url": "https://hooks.example/triloop", "events": ["gate.failed"]}
    for who in ("engineer", "auditor", "admin"):
        assert_problem(await api.post("/api/webhooks", headers=people[who].headers, json=body),
                       403, "no rule lets user", "create webhook")
    assert_problem(await api.get("/api/webhooks", headers=people["engineer"].headers), 403)

    operator = people["operator"]
    made = await api.post("/api/webhooks", headers=operator.headers, json=body)
    assert made.status_code == 201, made.text
    webhook = made.json()
    assert len(webhook["secret"]) >= 24 and webhook["events"] == ["gate.failed"]
    assert webhook["created_by"] == operator.name and webhook["disabled_at"] is None
    listed = await api.get("/api/webhooks", headers=people["auditor"].headers)
    assert listed.status_code == 200
    mine = [w for w in listed.json() if w["id"] == webhook["id"]]
    assert mine and "secret" not in mine[0]
    shown = await api.get(f"/api/webhooks/{webhook['id']}", headers=operator.headers)
    assert shown.status_code == 200 and "secret" not in shown.json()
    everything = json.dumps(listed.json()) + shown.text
    assert webhook["secret"] not in everything

    assert_problem(await api.delete(f"/api/webhooks/{webhook['id']}",
                                    headers=people["auditor"].headers), 403, "delete webhook")
    gone = await api.delete(f"/api/webhooks/{webhook['id']}", headers=operator.headers)
    assert gone.status_code == 200 and gone.json()["disabled_by"] == operator.name
    enabled = await api.get("/api/webhooks", headers=operator.headers)
    assert webhook["id"] not in [w["id"] for w in enabled.json()]
    every = await api.get("/api/webhooks?include_disabled=true", headers=operator.headers)
    assert webhook["id"] in [w["id"] for w in every.json()]
    with owner_engine.connect() as conn:  # the decision and its outcome, for each person
        acts = conn.execute(text(
            "SELECT actor->>'user', action, decision FROM audit_event WHERE "
            "resource->>'kind' = 'webhook' AND action IN ('create', 'delete') AND "
            "actor->>'user' IN (:o, :e) ORDER BY seq"),
            {"o": operator.name, "e": people["engineer"].name}).all()
    assert [tuple(a) for a in acts][-5:] == [
        (people["engineer"].name, "create", "deny"), (operator.name, "create", "allow"),
        (operator.name, "create", "record"), (operator.name, "delete", "allow"),
        (operator.name, "delete", "record")]


async def test_webhook_requests_are_validated(
    api: httpx.AsyncClient, people: dict[str, Person],
) -> None:
    operator = people["operator"].headers
    for bad, field_name in (
        ({"url": "ftp://hooks.example/x"}, "url"),
        ({"url": "hooks.example/x"}, "url"),
        ({"url": "https://user:pw@hooks.example/x"}, "credentials"),
        ({"url": "https://hooks.example/x", "events": ["promotion.promoted"]}, "events"),
        ({"url": "https://hooks.example/x", "events": []}, "events"),
        ({"url": "https://hooks.example/x", "secret": "short"}, "secret"),
    ):
        assert_problem(await api.post("/api/webhooks", headers=operator, json=bad), 422,
                       field_name)
    assert_problem(await api.get("/api/webhooks/wh-nothing", headers=operator), 404,
                   "wh-nothing")
    assert_problem(await api.delete("/api/webhooks/wh-nothing", headers=operator), 404)
    assert_problem(await api.get("/api/webhooks/wh-nothing/deliveries", headers=operator), 404)


async def test_a_receiver_gets_each_event_kind_signed(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    role_engine: Callable[[str], Engine], web_engine: Engine, settings: Settings,
    receiver: Receiver,
) -> None:
    operator = people["operator"]
    webhook_id = await _webhook(api, operator, receiver.url)
    # Each event happens through the code of the service that owns it, under its own role.
    governance, learning = role_engine("governance"), role_engine("learning")
    gov_authorizer = build_authorizer(settings, "governance")
    promotions = PromotionActivities(governance, gov_authorizer,
                                     timing=PromotionTiming.for_profile("test"))
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            current_gate=None, with_workflow=False)
    promotion = seeded.promotion_id
    for gate in ("canary", "audit", "approval"):
        promotions.mark_promotion(MarkPromotion(promotion_id=promotion, gate=gate))
    promotions.record_gate(GateRecord(promotion_id=promotion, gate="shadow",
                                      reasons=["looked fine"], verdict="pass"))
    promotions.record_gate(GateRecord(promotion_id=promotion, gate="canary",
                                      reasons=["success fell 0.8 -> 0.4"],
                                      verdict="abort_regression"))
    alias = uid("alias-").lower()
    make_deployment(owner_engine, alias, seeded.checkpoint_id, make_checkpoint(owner_engine))
    rollbacks = RollbackActivities(governance, gov_authorizer)
    rollbacks.rollback_deployment(RollbackInput(
        alias=alias, promotion_id=promotion, reason="watch: success regressed"))
    by_hand = uid("alias-").lower()  # and an operator's, carried out from their decision
    make_deployment(owner_engine, by_hand, make_checkpoint(owner_engine),
                    make_checkpoint(owner_engine))
    rollbacks.rollback_deployment(RollbackInput(alias=by_hand, decision_id=record_decision(
        web_engine, kind="rollback", subject=by_hand, decision="rollback", user=operator.name,
        comment="p99 regression", owner=owner_engine)))
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    record_event(learning, actor=Actor(service="learning").to_input(), action="stability_alarm",
                 resource={"kind": "training_run", "id": run_id, "attrs": {}},
                 payload={"kind": "echo_trap", "iteration": 3, "message": "reward plateau",
                          "evidence": {}})  # as learning_loop.activities.update writes it
    runs = RunActivities(engine=learning, authorizer=build_authorizer(settings, "learning"))
    runs.set_run_status(RunStatusInput(run_id, "running"))
    runs.set_run_status(RunStatusInput(run_id, "completed", "3 of 3 iterations"))
    runs.set_run_status(RunStatusInput(run_id, "completed", "3 of 3 iterations"))  # a retry

    dispatcher = _dispatcher(web_engine)
    try:
        first = dispatcher.run_once()
        dispatcher.run_once()  # nothing more is owed for these: each event once (below)
    finally:
        dispatcher.close()
    assert first.enqueued >= len(EventKind) and first.delivered >= len(EventKind)

    got = receiver.subjects(promotion, alias, by_hand, run_id)
    assert sorted(r.event for r in got) == sorted([*(k.value for k in EventKind),
                                                   EventKind.ROLLED_BACK.value])
    assert all(r.signature_error is None for r in got), [r.signature_error for r in got]
    assert all(r.body["event"] == r.event for r in got)
    by_kind = {r.event: r.body for r in got if r.body["subject"]["id"] != by_hand}
    operators = [r.body for r in got if r.body["subject"]["id"] == by_hand]
    assert [(b["data"]["automatic"], b["summary"]) for b in operators] == [
        (False, f"{by_hand} was rolled back by {operator.name}: p99 regression")]
    awaiting = by_kind["promotion.awaiting_audit"]
    assert awaiting["data"]["run_id"] == seeded.run_id
    assert awaiting["data"]["submitted_by"] == people["engineer"].name
    assert awaiting["console_path"] == f"/promotions/{promotion}"
    assert by_kind["gate.failed"]["data"]["gate"] == "canary"
    assert "success fell" in by_kind["gate.failed"]["summary"]
    assert by_kind["deployment.rolled_back"]["data"]["automatic"] is True
    assert by_kind["run.alarm"]["data"]["alarm"] == "echo_trap"
    assert by_kind["run.ended"]["data"]["status"] == "completed"

    audited = [a for a in _audited(owner_engine, webhook_id)
               if a["delivery_id"] in {r.delivery_id for r in got}]
    assert sorted(a["delivery_id"] for a in audited) == sorted(r.delivery_id for r in got)
    assert {(a["db_role"], a["outcome"], a["attempt"]) for a in audited} == {
        ("triloop_web", "delivered", 1)}
    listed = await api.get(f"/api/webhooks/{webhook_id}/deliveries",
                           headers=people["auditor"].headers)
    assert listed.status_code == 200
    seqs = {r.body["audit_seq"] for r in got}
    assert sorted((d["event"], d["status"], d["attempts"]) for d in listed.json()
                  if d["audit_seq"] in seqs) == sorted((r.event, "delivered", 1) for r in got)
    await api.delete(f"/api/webhooks/{webhook_id}", headers=operator.headers)


async def test_a_webhook_gets_only_the_kinds_it_asked_for_from_its_creation_on(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    role_engine: Callable[[str], Engine], web_engine: Engine, settings: Settings,
    receiver: Receiver,
) -> None:
    learning = role_engine("learning")
    runs = RunActivities(engine=learning, authorizer=build_authorizer(settings, "learning"))
    before = make_run(owner_engine)
    runs.set_run_status(RunStatusInput(before, "failed", "ended before the webhook"))
    webhook_id = await _webhook(api, people["operator"], receiver.url, ["run.ended"])
    after = make_run(owner_engine)
    record_event(learning, actor=Actor(service="learning").to_input(), action="stability_alarm",
                 resource={"kind": "training_run", "id": after, "attrs": {}},
                 payload={"kind": "echo_trap", "iteration": 1, "message": "m", "evidence": {}})
    runs.set_run_status(RunStatusInput(after, "failed", "rollout batch lost"))
    dispatcher = _dispatcher(web_engine)
    try:
        dispatcher.run_once()
    finally:
        dispatcher.close()
    assert [(r.event, r.body["subject"]["id"]) for r in receiver.subjects(before, after)] == [
        ("run.ended", after)]
    # Disabled before its next event was sent: that delivery ends, saying why.
    later = make_run(owner_engine)
    runs.set_run_status(RunStatusInput(later, "completed", "done"))
    with session_scope(web_engine) as session:
        assert enqueue_events(session=session) == 1
    operator = people["operator"]
    await api.delete(f"/api/webhooks/{webhook_id}", headers=operator.headers)
    shown = await api.get(f"/api/webhooks/{webhook_id}/deliveries", headers=operator.headers)
    assert [(d["status"], d["attempts"], d["last_error"]) for d in shown.json()][0] == (
        "failed", 0, f"not sent: the webhook was disabled by {operator.name}")


async def test_a_failed_delivery_is_retried_with_backoff_then_given_up(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    role_engine: Callable[[str], Engine], web_engine: Engine, settings: Settings,
    receiver: Receiver,
) -> None:
    operator = people["operator"]
    flaky = await _webhook(api, operator, receiver.url, ["run.ended"])
    # A port nothing listens on: every attempt is refused.
    dead = await _webhook(api, operator, "http://127.0.0.1:9/hooks", ["run.ended"])
    run_id = make_run(owner_engine)
    RunActivities(engine=role_engine("learning"),
                       authorizer=build_authorizer(settings, "learning")).set_run_status(
        RunStatusInput(run_id, "cancelled", "workflow cancelled in Temporal"))
    receiver.fail_next = 1
    key = f"run:{run_id}:ended"

    slow = _dispatcher(web_engine, retry_base_s=600.0, max_attempts=2, timeout_s=2.0)
    try:
        first = slow.run_once()
        assert first.retrying >= 2  # the flaky receiver's 500 and the refused connection
        again = slow.run_once()  # nothing is due for ten minutes
        assert (again.delivered, again.retrying, again.gave_up) == (0, 0, 0)
    finally:
        slow.close()
    with owner_engine.connect() as conn:
        waits = conn.execute(text(
            "SELECT webhook_id, attempts, next_attempt_at - now() > interval '590 seconds'"
            " FROM webhook_delivery WHERE webhook_id IN (:f, :d) AND event_key = :k"),
            {"f": flaky, "d": dead, "k": key}).all()
        assert sorted(tuple(w) for w in waits) == sorted([(flaky, 1, True), (dead, 1, True)])
        conn.execute(text("UPDATE webhook_delivery SET next_attempt_at = now() "  # time passes
                          "WHERE webhook_id IN (:f, :d) AND event_key = :k"),
                     {"f": flaky, "d": dead, "k": key})
        conn.commit()
    fast = _dispatcher(web_engine, max_attempts=2, timeout_s=2.0)
    try:
        fast.run_once()
    finally:
        fast.close()

    got = receiver.subjects(run_id)
    assert [r.event for r in got] == ["run.ended", "run.ended"]
    assert got[0].delivery_id == got[1].delivery_id  # a receiver can drop a repeat by its id
    assert all(r.signature_error is None for r in got)
    assert [(a["outcome"], a["attempt"], a["status_code"]) for a in
            _audited(owner_engine, flaky, key)] == [("retrying", 1, 500), ("delivered", 2, 204)]
    dead_attempts = _audited(owner_engine, dead, key)
    assert [(a["outcome"], a["attempt"]) for a in dead_attempts] == [
        ("retrying", 1), ("gave_up", 2)]
    assert dead_attempts[0]["retry_in_s"] == 600.0 and "ConnectError" in dead_attempts[1]["error"]
    shown = await api.get(f"/api/webhooks/{dead}/deliveries", headers=operator.headers)
    assert [(d["status"], d["attempts"], d["next_attempt_at"]) for d in shown.json()
            if d["event_key"] == key] == [("failed", 2, None)]
    for webhook_id in (flaky, dead):
        await api.delete(f"/api/webhooks/{webhook_id}", headers=operator.headers)


def test_the_web_service_sends_webhooks_while_it_is_served(
    web_settings: Settings, people: dict[str, Person], owner_engine: Engine,
    role_engine: Callable[[str], Engine], settings: Settings, receiver: Receiver,
) -> None:
    from web.app import create_app

    app: FastAPI = create_app(web_settings.model_copy(update={"webhook_poll_s": 0.05}))
    operator = people["operator"].headers
    with TestClient(app) as client:  # serving: the lifespan runs the dispatcher
        made = client.post("/api/webhooks", headers=operator, json={
            "url": receiver.url, "secret": SECRET, "events": ["run.ended"]})
        assert made.status_code == 201, made.text
        run_id = make_run(owner_engine)
        RunActivities(engine=role_engine("learning"),
                           authorizer=build_authorizer(settings, "learning")).set_run_status(
            RunStatusInput(run_id, "completed", "done"))
        for _ in range(600):  # the dispatcher's next passes (a hang is the timeout's to end)
            if receiver.subjects(run_id):
                break
            time.sleep(0.05)
        assert [r.event for r in receiver.subjects(run_id)] == ["run.ended"]
        client.delete(f"/api/webhooks/{made.json()['id']}", headers=operator)


def test_the_cli_configures_webhooks_through_the_api_with_the_persons_token(
    web_app: FastAPI, people: dict[str, Person], monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = TestClient(web_app)  # not served: no dispatcher runs

    def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("timeout", None)
        return client.request(method, url.replace("http://127.0.0.1:8000", ""), **kwargs)

    monkeypatch.setattr(httpx, "request", request)
    monkeypatch.delenv("TRILOOP_TOKEN", raising=False)
    root = typer.Typer()
    root.add_typer(webhooks_app, name="webhooks")
    runner = CliRunner()
    operator, auditor = people["operator"].token, people["auditor"].token
    refused = runner.invoke(root, ["webhooks", "create", "https://hooks.example/cli",
                                   "--token", auditor])
    assert refused.exit_code == 1 and "403" in refused.output
    made = runner.invoke(root, ["webhooks", "create", "https://hooks.example/cli", "--event",
                                "gate.failed", "--event", "run.ended", "--token", operator])
    assert made.exit_code == 0, made.output
    assert "sends gate.failed, run.ended to https://hooks.example/cli" in made.output
    assert "secret (shown once): " in made.output
    webhook_id = made.output.split()[1]
    listed = runner.invoke(root, ["webhooks", "list", "--output", "json", "--token", auditor])
    assert listed.exit_code == 0 and webhook_id in listed.output
    assert made.output.split("secret (shown once): ")[1].split()[0] not in listed.output
    shown = runner.invoke(root, ["webhooks", "deliveries", webhook_id, "--token", auditor])
    assert shown.exit_code == 0, shown.output
    gone = runner.invoke(root, ["webhooks", "disable", webhook_id, "--token", operator])
    assert gone.exit_code == 0 and f"webhook {webhook_id} disabled by" in gone.output


async def test_a_loop_that_forges_another_loops_event_row_notifies_nobody(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    role_engine: Callable[[str], Engine], web_engine: Engine, receiver: Receiver,
) -> None:
    """The attacker's way in: execution, with its own password, appends audit rows shaped
    exactly like governance's failed gate and learning's alarm. Claiming to be them is
    refused by the database; as itself, the rows are stamped with execution's role, and no
    webhook hears of them."""
    from sqlalchemy.exc import ProgrammingError

    webhook_id = await _webhook(api, people["operator"], receiver.url)
    execution = role_engine("execution")
    promotion = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    run_id = make_run(owner_engine)
    forged = [("governance", "gate_result",
               {"kind": "promotion", "id": promotion.promotion_id, "attrs": {}},
               {"gate": "offline_eval", "passed": False, "reasons": ["forged"]}),
              ("learning", "stability_alarm", {"kind": "training_run", "id": run_id, "attrs": {}},
               {"kind": "echo_trap", "iteration": 1, "message": "m", "evidence": {}})]
    for claimed, action, resource, payload in forged:
        with pytest.raises(ProgrammingError, match="writes only its own service's events"):
            record_event(execution, actor=Actor(service=claimed).to_input(), action=action,
                         resource=resource, payload=payload)
        record_event(execution, actor=Actor(service="execution").to_input(), action=action,
                     resource=resource, payload=payload)
    with owner_engine.connect() as conn:
        stamped = conn.execute(text(
            "SELECT DISTINCT db_role FROM audit_event WHERE resource->>'id' IN (:p, :r)"),
            {"p": promotion.promotion_id, "r": run_id}).scalars().all()
    assert stamped == ["triloop_execution"]
    dispatcher = _dispatcher(web_engine)
    try:
        dispatcher.run_once()
    finally:
        dispatcher.close()
    assert receiver.subjects(promotion.promotion_id, run_id) == []
    assert _audited(owner_engine, webhook_id) == []
