"""The webhook tables: configuration, the events each webhook is owed, and each attempt.

Keyword-only functions over a session of the web role (the only role with these tables).
A webhook's ``scanned_seq`` says how far the audit log has been read for it; reading on
(``enqueue_events``) and the deliveries it makes commit together, so a crash reads the
same rows again and the unique ``(webhook_id, event_key)`` keeps one delivery per event.
The audit log's ``seq`` is assigned under its chain lock, which its writer holds until it
commits, so every row up to the head read first is already visible.

Claiming due deliveries (``claim_due``) leases them (``next_attempt_at`` moves past the
attempt's time) in a short transaction of its own, so two dispatchers never send one
delivery at once and the HTTP call holds no lock; ``finish_attempt`` records the outcome
and appends it to the audit log in one transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, text
from sqlalchemy.dialects.postgresql import insert
from sqlmodel import Session, col, select

from triloop.audit import append_event
from triloop.models.audit import AuditEvent
from triloop.models.governance import Promotion
from triloop.models.training import TrainingRun
from triloop.models.webhooks import Webhook, WebhookDelivery
from triloop.notifications.delivery import Attempt, DeliveryPolicy
from triloop.notifications.events import SOURCE_ACTIONS, Event, EventKind, classify
from triloop.policy import Actor

DELIVER_ACTION = "deliver_webhook"
WEB_ACTOR = Actor(service="web").to_input()  # the web service itself, for no person
SCAN_BATCH = 500


def new_webhook_id() -> str:
    """``wh-`` and a random hex id."""
    return f"wh-{uuid.uuid4().hex}"


def audit_head(*, session: Session) -> int:
    """The newest audit row's ``seq`` (0 for an empty log)."""
    head = session.exec(select(func.max(col(AuditEvent.seq)))).one()
    return int(head or 0)


def create_webhook(*, session: Session, url: str, events: Sequence[EventKind], secret: str,
                   description: str, created_by: str) -> Webhook:
    """A new webhook that hears of events audited from now on."""
    webhook = Webhook(id=new_webhook_id(), url=url, events=[str(e) for e in events],
                      secret=secret, description=description, created_by=created_by,
                      scanned_seq=audit_head(session=session))
    session.add(webhook)
    session.flush()
    return webhook


def list_webhooks(*, session: Session, include_disabled: bool = False) -> list[Webhook]:
    """Webhooks, newest first."""
    query = select(Webhook).order_by(col(Webhook.created_at).desc(), col(Webhook.id))
    if not include_disabled:
        query = query.where(col(Webhook.disabled_at).is_(None))
    return list(session.exec(query))


def get_webhook(*, session: Session, webhook_id: str) -> Webhook | None:
    """One webhook, enabled or not."""
    return session.get(Webhook, webhook_id)


def disable_webhook(*, session: Session, webhook_id: str, disabled_by: str) -> Webhook | None:
    """Stop a webhook: nothing more is sent to it (its deliveries stay on record; those
    still pending end ``failed``, saying why)."""
    webhook = session.get(Webhook, webhook_id, with_for_update=True)
    if webhook is None or webhook.disabled_at is not None:
        return webhook
    webhook.disabled_at = session.exec(select(func.now())).one()
    webhook.disabled_by = disabled_by
    session.add(webhook)
    session.execute(text(  # what it was still owed will not be sent: say so on each
        "UPDATE webhook_delivery SET status = 'failed', last_error = :why "
        "WHERE webhook_id = :w AND status = 'pending'"),
        {"w": webhook_id, "why": f"not sent: the webhook was disabled by {disabled_by}"})
    session.flush()
    return webhook


def deliveries_of(*, session: Session, webhook_id: str, limit: int) -> list[WebhookDelivery]:
    """A webhook's deliveries, newest first."""
    return list(session.exec(
        select(WebhookDelivery).where(col(WebhookDelivery.webhook_id) == webhook_id)
        .order_by(col(WebhookDelivery.created_at).desc(), col(WebhookDelivery.id).desc())
        .limit(limit)))


def enqueue_events(*, session: Session, batch: int = SCAN_BATCH) -> int:
    """Read the audit log on for each enabled webhook; one delivery per event it wants."""
    head = audit_head(session=session)
    webhooks = list(session.exec(
        select(Webhook).where(col(Webhook.disabled_at).is_(None),
                              col(Webhook.scanned_seq) < head)
        .with_for_update(skip_locked=True)))
    made = 0
    facts = _Facts(session)
    for webhook in webhooks:
        rows = list(session.exec(
            select(AuditEvent)
            .where(col(AuditEvent.seq) > webhook.scanned_seq, col(AuditEvent.seq) <= head,
                   col(AuditEvent.action).in_(SOURCE_ACTIONS))
            .order_by(col(AuditEvent.seq)).limit(batch)))
        wanted = set(webhook.events)
        for row in rows:
            event = classify(row)
            if event is not None and event.kind.value in wanted:
                made += _enqueue(session, webhook.id, row, event, facts)
        webhook.scanned_seq = rows[-1].seq if len(rows) == batch else head
        session.add(webhook)
    session.flush()
    return made


def _enqueue(session: Session, webhook_id: str, row: AuditEvent, event: Event,
             facts: _Facts) -> int:
    body = event.body(row)
    body["data"].update(facts.about(event.subject_kind, event.subject_id))
    inserted = session.execute(
        insert(WebhookDelivery).values(
            id=f"whd-{uuid.uuid4().hex}", webhook_id=webhook_id, event_kind=event.kind.value,
            event_key=event.key, audit_seq=row.seq, body=body, status="pending",
            attempts=0, next_attempt_at=func.now(), created_at=func.now())
        .on_conflict_do_nothing(index_elements=["webhook_id", "event_key"])
        .returning(col(WebhookDelivery.id)))
    return len(inserted.all())  # 0 when the event was already owed


class _Facts:
    """What a person needs beside the event: the run or candidate it is about."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._seen: dict[tuple[str, str], dict[str, Any]] = {}

    def about(self, kind: str, subject_id: str) -> dict[str, Any]:
        key = (kind, subject_id)
        if key not in self._seen:
            self._seen[key] = self._read(kind, subject_id)
        return self._seen[key]

    def _read(self, kind: str, subject_id: str) -> dict[str, Any]:
        if kind == "promotion":
            promotion = self._session.get(Promotion, subject_id)
            if promotion is not None:
                return {"checkpoint_id": promotion.checkpoint_id, "run_id": promotion.run_id,
                        "submitted_by": promotion.submitted_by}
        if kind == "training_run":
            run = self._session.get(TrainingRun, subject_id)
            if run is not None:
                return {"run_name": run.name, "submitted_by": run.submitted_by}
        return {}


@dataclass(frozen=True)
class ClaimedDelivery:
    """A delivery leased for one attempt, with what the attempt needs."""

    id: str
    webhook_id: str
    url: str
    secret: str
    event_kind: str
    event_key: str
    audit_seq: int
    body: dict[str, Any]
    attempt: int  # this attempt's number, from 1


_CLAIM = text("""
UPDATE webhook_delivery d SET attempts = d.attempts + 1,
       next_attempt_at = now() + make_interval(secs => :lease)
  FROM webhook w
 WHERE w.id = d.webhook_id AND d.id IN (
       SELECT p.id FROM webhook_delivery p JOIN webhook x ON x.id = p.webhook_id
        WHERE p.status = 'pending' AND p.next_attempt_at <= now() AND x.disabled_at IS NULL
        ORDER BY p.next_attempt_at, p.id LIMIT :limit FOR UPDATE OF p SKIP LOCKED)
RETURNING d.id, d.webhook_id, w.url, w.secret, d.event_kind, d.event_key, d.audit_seq, d.body,
          d.attempts
""")


def claim_due(*, session: Session, policy: DeliveryPolicy) -> list[ClaimedDelivery]:
    """Lease the deliveries due now (of enabled webhooks), oldest due first."""
    rows = session.execute(_CLAIM, {"lease": policy.lease_s, "limit": policy.batch}).all()
    return [ClaimedDelivery(id=r[0], webhook_id=r[1], url=r[2], secret=r[3], event_kind=r[4],
                            event_key=r[5], audit_seq=int(r[6]), body=dict(r[7]),
                            attempt=int(r[8])) for r in rows]


def finish_attempt(*, session: Session, claimed: ClaimedDelivery, result: Attempt,
                   policy: DeliveryPolicy) -> str:
    """Record one attempt on its delivery and in the audit log; the outcome's word
    (``delivered``, ``retrying`` or ``gave_up``)."""
    delivery = session.get(WebhookDelivery, claimed.id, with_for_update=True)
    assert delivery is not None  # deliveries are never deleted
    now: datetime = session.exec(select(func.now())).one()
    delay = None if result.delivered else policy.retry_delay_s(claimed.attempt)
    delivery.last_status_code, delivery.last_error = result.status_code, result.error
    if result.delivered:
        outcome, delivery.status, delivery.delivered_at = "delivered", "delivered", now
    elif delay is None:
        outcome, delivery.status = "gave_up", "failed"
    else:
        outcome, delivery.next_attempt_at = "retrying", now + timedelta(seconds=delay)
    session.add(delivery)
    append_event(session, actor=WEB_ACTOR, action=DELIVER_ACTION,
                 resource={"kind": "webhook", "id": claimed.webhook_id}, decision="record",
                 payload={"delivery_id": claimed.id, "event": claimed.event_kind,
                          "event_key": claimed.event_key, "audit_seq": claimed.audit_seq,
                          "attempt": claimed.attempt, "outcome": outcome,
                          "status_code": result.status_code, "error": result.error,
                          "retry_in_s": delay})
    return outcome
