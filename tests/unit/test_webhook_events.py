"""Webhooks' pure parts: which audit rows are events, the signature, the retry schedule."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from triloop.models.audit import AuditEvent
from triloop.notifications.delivery import DeliveryPolicy
from triloop.notifications.events import EventKind, classify
from triloop.notifications.signing import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureInvalid,
    body_bytes,
    signed_headers,
    verify,
)

GOVERNANCE = ({"service": "governance", "roles": []}, "triloop_governance")
LEARNING = ({"service": "learning", "roles": []}, "triloop_learning")


def _row(writer: tuple[dict[str, Any], str], action: str, resource: dict[str, Any],
         decision: str = "record", payload: dict[str, Any] | None = None,
         seq: int = 7) -> AuditEvent:
    actor, role = writer
    return AuditEvent(seq=seq, at=datetime(2026, 12, 2, tzinfo=UTC), actor=actor, action=action,
                      resource=resource, decision=decision, payload=payload or {},
                      prev_hash="0" * 64, hash=f"{seq:064x}", db_role=role)


def _promotion(gate: str | None, status: str | None = None) -> dict[str, Any]:
    return {"kind": "promotion", "id": "p1", "attrs": {"gate": gate, "status": status}}


def test_a_promotion_at_the_audit_or_approval_gate_waits_for_a_person() -> None:
    audit = classify(_row(GOVERNANCE, "update", _promotion("audit"), "allow"))
    approval = classify(_row(GOVERNANCE, "update", _promotion("approval"), "allow"))
    assert audit is not None and audit.kind is EventKind.AWAITING_AUDIT
    assert approval is not None and approval.kind is EventKind.AWAITING_APPROVAL
    assert audit.key == "promotion:p1:awaiting:audit" and "auditor" in audit.summary
    assert audit.body(_row(GOVERNANCE, "update", _promotion("audit"), "allow"))[
        "console_path"] == "/promotions/p1"
    # Other gates, an ending, a refused update or another service's row are no such event.
    assert classify(_row(GOVERNANCE, "update", _promotion("canary"), "allow")) is None
    assert classify(_row(GOVERNANCE, "update", _promotion("audit", "rejected"), "allow")) is None
    assert classify(_row(GOVERNANCE, "update", _promotion("audit"), "deny")) is None
    assert classify(_row(LEARNING, "update", _promotion("audit"), "allow")) is None


def test_a_failed_gate_is_an_event_and_a_passed_one_is_not() -> None:
    failed = classify(_row(GOVERNANCE, "gate_result", {"kind": "promotion", "id": "p1"},
                           payload={"gate": "canary", "passed": False, "verdict": "abort",
                                    "reasons": ["success fell 0.8 -> 0.4"],
                                    "gate_result_id": "g1"}))
    assert failed is not None and failed.kind is EventKind.GATE_FAILED
    assert failed.key == "gate_result:g1"
    assert failed.summary == "The canary gate failed (abort): success fell 0.8 -> 0.4."
    assert classify(_row(GOVERNANCE, "gate_result", {"kind": "promotion", "id": "p1"},
                         payload={"gate": "canary", "passed": True})) is None


def test_a_rollback_says_whether_a_person_asked_for_it() -> None:
    resource = {"kind": "deployment", "id": "production"}
    automatic = classify(_row(GOVERNANCE, "rollback", resource, payload={
        "from": "c2", "to": "c1", "requested_by": "governance", "reason": "watch: regressed",
        "human_decision_id": None}))
    by_hand = classify(_row(GOVERNANCE, "rollback", resource, seq=8, payload={
        "from": "c2", "to": "c1", "requested_by": "olga", "reason": "p99",
        "human_decision_id": "d1"}))
    assert automatic is not None and automatic.kind is EventKind.ROLLED_BACK
    assert automatic.data["automatic"] is True
    assert automatic.summary == "production was rolled back automatically: watch: regressed"
    assert by_hand is not None and by_hand.data["automatic"] is False
    assert by_hand.summary == "production was rolled back by olga: p99"
    assert automatic.key != by_hand.key
    assert classify(_row(GOVERNANCE, "refuse_rollback", resource)) is None


def test_alarms_and_a_runs_end_come_from_the_learning_role_only() -> None:
    run = {"kind": "training_run", "id": "r1", "attrs": {}}
    alarm_payload = {"kind": "echo_trap", "iteration": 4, "message": "reward plateau"}
    alarm = classify(_row(LEARNING, "stability_alarm", run, payload=alarm_payload))
    assert alarm is not None and alarm.kind is EventKind.ALARM
    assert alarm.key == "alarm:r1:4:echo_trap"
    ended = classify(_row(LEARNING, "update", {**run, "attrs": {"status": "completed"}},
                          "allow", {"context": {"reason": "20 of 20 iterations"}}))
    assert ended is not None and ended.kind is EventKind.RUN_ENDED
    assert ended.summary == "A training run ended (completed): 20 of 20 iterations"
    cancelled = classify(_row(LEARNING, "cancel", run, "allow", {"context": {
        "on_behalf_of": {"user": "uma", "roles": ["ml_engineer"]}, "reason": "wrong config"}}))
    assert cancelled is not None and cancelled.data["status"] == "cancelled"
    assert cancelled.data["by"] == "uma" and cancelled.key == ended.key  # one end per run
    assert cancelled.summary == "A training run ended (cancelled by uma): wrong config"
    assert classify(_row(LEARNING, "update", {**run, "attrs": {"status": "running"}},
                         "allow")) is None
    # The same rows written by another role (the owner, in set-up) are not events.
    assert classify(_row(({"service": "learning"}, "triloop"), "stability_alarm", run,
                         payload=alarm_payload)) is None
    assert classify(_row(GOVERNANCE, "stability_alarm", run, payload=alarm_payload)) is None


def test_a_signature_proves_the_body_the_secret_and_the_time() -> None:
    secret, body = "s" * 32, body_bytes({"event": "run.ended", "n": 1})
    headers = signed_headers(secret=secret, timestamp=1_000, body=body, event="run.ended",
                             delivery_id="whd-1")
    verify(secret=secret, body=body, headers=headers, now=1_010)
    lowercase = {k.lower(): v for k, v in headers.items()}
    verify(secret=secret, body=body, headers=lowercase, now=1_010)
    with pytest.raises(SignatureInvalid, match="does not match the body"):
        verify(secret=secret, body=body + b" ", headers=headers, now=1_010)
    with pytest.raises(SignatureInvalid, match="does not match the body"):
        verify(secret="t" * 32, body=body, headers=headers, now=1_010)
    with pytest.raises(SignatureInvalid, match="beyond the 300s tolerance"):
        verify(secret=secret, body=body, headers=headers, now=2_000)
    with pytest.raises(SignatureInvalid, match="no Triloop-Timestamp"):
        verify(secret=secret, body=body, headers={SIGNATURE_HEADER: "v1=00"}, now=1_000)
    with pytest.raises(SignatureInvalid, match="not Unix seconds"):
        verify(secret=secret, body=body, headers={**headers, TIMESTAMP_HEADER: "noon"},
               now=1_000)


def test_retries_back_off_exponentially_up_to_a_cap_then_give_up() -> None:
    policy = DeliveryPolicy(retry_base_s=10, retry_max_s=60, max_attempts=5)
    assert [policy.retry_delay_s(n) for n in range(1, 6)] == [10, 20, 40, 60, None]
