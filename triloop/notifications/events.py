"""Which audit rows are events a person waits for: a pure reading of one row at a time.

Each kind is recognised only in a row its owning service wrote, as the database stamped
it (``db_role``): governance's for promotions, gates and rollbacks, learning's for alarms
and a run's end. Rows from before ``db_role`` was recorded are not events.

- ``promotion.awaiting_audit`` / ``promotion.awaiting_approval``: governance's allowed
  ``update`` of a promotion to the audit or approval gate (the workflow asks the policy
  before it marks the gate; the row is the decision it was allowed).
- ``gate.failed``: governance's ``gate_result`` record with ``passed`` false.
- ``deployment.rolled_back``: governance's ``rollback`` record, automatic (the watch's)
  when no person's decision is named, else the operator's.
- ``run.alarm``: learning's ``stability_alarm`` record.
- ``run.ended``: learning's allowed ``update`` of a run to a finished status, or its
  allowed ``cancel`` carrying out a person's decision.

An event's ``key`` names it once: an activity retried after the policy allowed it audits
a second row for the same thing, and the outbox makes one delivery per key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from triloop.audit import SERVICE_ROLES
from triloop.models.audit import AuditEvent
from triloop.statuses import FINISHED_RUN_STATUSES, Gate, RunStatus, Word


class EventKind(Word):
    """The kinds of event a webhook may subscribe to."""

    AWAITING_AUDIT = "promotion.awaiting_audit"
    AWAITING_APPROVAL = "promotion.awaiting_approval"
    GATE_FAILED = "gate.failed"
    ROLLED_BACK = "deployment.rolled_back"
    ALARM = "run.alarm"
    RUN_ENDED = "run.ended"


# The audit actions any event is read from (the outbox asks the database for these only).
SOURCE_ACTIONS = ("update", "cancel", "gate_result", "rollback", "stability_alarm")

_AWAITING = {Gate.AUDIT.value: (EventKind.AWAITING_AUDIT, "an auditor's sign-off"),
             Gate.APPROVAL.value: (EventKind.AWAITING_APPROVAL, "an operator's approval")}
_FINISHED = {str(s) for s in FINISHED_RUN_STATUSES}


@dataclass(frozen=True)
class Event:
    """One event as a webhook receives it (``body``), named once by ``key``."""

    kind: EventKind
    key: str
    subject_kind: str
    subject_id: str
    summary: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def body(self, row: AuditEvent) -> dict[str, Any]:
        """The JSON document delivered, with the audit row it was read from."""
        return {
            "event": self.kind.value, "key": self.key,
            "occurred_at": row.at.isoformat(), "audit_seq": row.seq,
            "subject": {"kind": self.subject_kind, "id": self.subject_id},
            "summary": self.summary, "data": dict(self.data),
            "console_path": console_path(self.subject_kind, self.subject_id),
        }


def console_path(kind: str, subject_id: str) -> str | None:
    """Where a person sees the subject in the console (relative to its address)."""
    return {"promotion": f"/promotions/{subject_id}", "training_run": f"/runs/{subject_id}",
            "deployment": "/deployments"}.get(kind)


def classify(row: AuditEvent) -> Event | None:
    """The event this audit row is, or None."""
    resource = row.resource or {}
    kind, subject = str(resource.get("kind") or ""), str(resource.get("id") or "")
    if not subject:
        return None
    if _written_by(row, "governance"):
        if kind == "promotion":
            return _awaiting(row, subject) if row.action == "update" else (
                _gate_failed(row, subject) if row.action == "gate_result" else None)
        if kind == "deployment" and row.action == "rollback" and row.decision == "record":
            return _rolled_back(row, subject)
    elif _written_by(row, "learning") and kind == "training_run":
        if row.action == "stability_alarm" and row.decision == "record":
            return _alarm(row, subject)
        if row.action in ("update", "cancel") and row.decision == "allow":
            return _run_ended(row, subject)
    return None


def _written_by(row: AuditEvent, service: str) -> bool:
    actor = row.actor or {}
    return actor.get("service") == service and row.db_role == SERVICE_ROLES[service]


def _attrs(row: AuditEvent) -> Mapping[str, Any]:
    attrs = (row.resource or {}).get("attrs") or {}
    return attrs if isinstance(attrs, Mapping) else {}


def _context(row: AuditEvent) -> Mapping[str, Any]:
    context = (row.payload or {}).get("context") or {}
    return context if isinstance(context, Mapping) else {}


def _awaiting(row: AuditEvent, promotion_id: str) -> Event | None:
    attrs = _attrs(row)
    found = _AWAITING.get(str(attrs.get("gate") or ""))
    if row.decision != "allow" or found is None or attrs.get("status"):
        return None
    kind, who = found
    return Event(kind, f"promotion:{promotion_id}:awaiting:{attrs['gate']}", "promotion",
                 promotion_id, f"A candidate's promotion waits for {who}.",
                 {"promotion_id": promotion_id, "gate": attrs["gate"]})


def _gate_failed(row: AuditEvent, promotion_id: str) -> Event | None:
    payload = row.payload or {}
    if row.decision != "record" or payload.get("passed") is not False:
        return None
    gate, reasons = str(payload.get("gate") or "?"), [str(r) for r in payload.get("reasons") or []]
    verdict = str(payload.get("verdict") or "fail")
    because = f": {'; '.join(reasons)}" if reasons else ""
    return Event(EventKind.GATE_FAILED, f"gate_result:{payload.get('gate_result_id') or row.seq}",
                 "promotion", promotion_id, f"The {gate} gate failed ({verdict}){because}.",
                 {"promotion_id": promotion_id, "gate": gate, "verdict": verdict,
                  "reasons": reasons, "gate_result_id": payload.get("gate_result_id")})


def _rolled_back(row: AuditEvent, alias: str) -> Event:
    payload = row.payload or {}
    automatic = not payload.get("human_decision_id")
    by = "automatically" if automatic else f"by {payload.get('requested_by') or 'an operator'}"
    reason = str(payload.get("reason") or "").strip()
    return Event(EventKind.ROLLED_BACK, f"rollback:{alias}:{row.seq}", "deployment", alias,
                 f"{alias} was rolled back {by}" + (f": {reason}" if reason else "."),
                 {"alias": alias, "automatic": automatic,
                  "from_checkpoint_id": payload.get("from"), "to_checkpoint_id": payload.get("to"),
                  "requested_by": payload.get("requested_by"), "reason": reason,
                  "promotion_id": payload.get("promotion_id"),
                  "target_revision": payload.get("target_revision")})


def _alarm(row: AuditEvent, run_id: str) -> Event:
    payload = row.payload or {}
    alarm, iteration = str(payload.get("kind") or "alarm"), payload.get("iteration")
    message = str(payload.get("message") or alarm)
    return Event(EventKind.ALARM, f"alarm:{run_id}:{iteration}:{alarm}", "training_run", run_id,
                 f"A training run raised {alarm} at iteration {iteration}: {message}",
                 {"run_id": run_id, "alarm": alarm, "iteration": iteration, "message": message,
                  "evidence": payload.get("evidence") or {}})


def _run_ended(row: AuditEvent, run_id: str) -> Event | None:
    context = _context(row)
    if row.action == "cancel":
        person = context.get("on_behalf_of") or {}
        status, by = RunStatus.cancelled.value, person.get("user") if isinstance(
            person, Mapping) else None
    else:
        status, by = str(_attrs(row).get("status") or ""), None
    if status not in _FINISHED:
        return None
    reason = str(context.get("reason") or "").strip()
    summary = f"A training run ended ({status}" + (f" by {by}" if by else "") + ")" + (
        f": {reason}" if reason else ".")
    return Event(EventKind.RUN_ENDED, f"run:{run_id}:ended", "training_run", run_id, summary,
                 {"run_id": run_id, "status": status, "reason": reason, "by": by})
