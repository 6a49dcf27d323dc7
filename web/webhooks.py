"""Webhooks, configured by operators through the API: what is asked, checked and shown.

Making, disabling and reading webhooks are authorized by the policy for the signed-in
person (``policies/triloop/authz/webhooks.rego``: operators configure them, operators and
auditors read them, no loop touches them) and so audited, with the outcome beside each
allowed change (``web.audit_outcomes``). The shared secret is shown once, when the webhook
is made; no answer repeats it. What is sent, and when, is ``triloop.notifications``.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

from triloop.models.webhooks import Webhook, WebhookDelivery
from triloop.notifications import outbox
from triloop.notifications.events import EventKind
from web.deps import Guard, Sessions
from web.problems import not_found

KIND = "webhook"
MIN_SECRET_CHARS = 24


class WebhookCreate(BaseModel):
    """A URL to tell of events, the kinds it wants, and optionally the shared secret."""

    url: str = Field(min_length=1, max_length=2000,
                     description="http(s) URL the events are POSTed to")
    events: list[EventKind] = Field(
        default_factory=lambda: list(EventKind), min_length=1,
        description="the event kinds it receives (default: every kind)")
    secret: str | None = Field(
        default=None, min_length=MIN_SECRET_CHARS, max_length=200, pattern=r"^\S+$",
        description="shared secret deliveries are signed with (HMAC-SHA256); omitted: one is"
                    " generated and shown once in the answer")
    description: str = Field(default="", max_length=200, description="what it is for")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url must be an absolute http:// or https:// URL with a host")
        if parts.username or parts.password:
            raise ValueError("url must hold no credentials: the signature proves the sender;"
                             " check it with the shared secret")
        return value.strip()

    @field_validator("events")
    @classmethod
    def _each_once(cls, value: list[EventKind]) -> list[EventKind]:
        return list(dict.fromkeys(value))


class WebhookPublic(BaseModel):
    """A webhook as the API shows it: never its secret."""

    id: str
    url: str
    events: list[EventKind]
    description: str
    created_by: str
    created_at: datetime
    disabled_at: datetime | None = None
    disabled_by: str | None = None


class WebhookCreated(WebhookPublic):
    """A new webhook with its shared secret, shown this once."""

    secret: str


class DeliveryPublic(BaseModel):
    """One event owed to a webhook and how its attempts went."""

    id: str
    event: EventKind
    event_key: str
    audit_seq: int
    summary: str
    status: str = Field(description="pending | delivered | failed")
    attempts: int
    next_attempt_at: datetime | None = Field(description="when it is tried again (pending)")
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None


def public(webhook: Webhook) -> WebhookPublic:
    """The webhook without its secret."""
    return WebhookPublic(**_fields(webhook))


def _fields(webhook: Webhook) -> dict[str, Any]:
    return {"id": webhook.id, "url": webhook.url, "events": webhook.events,
            "description": webhook.description, "created_by": webhook.created_by,
            "created_at": webhook.created_at, "disabled_at": webhook.disabled_at,
            "disabled_by": webhook.disabled_by}


def _delivery(row: WebhookDelivery) -> DeliveryPublic:
    return DeliveryPublic(
        id=row.id, event=EventKind(row.event_kind), event_key=row.event_key,
        audit_seq=row.audit_seq, summary=str(row.body.get("summary") or ""), status=row.status,
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at if row.status == "pending" else None,
        last_status_code=row.last_status_code, last_error=row.last_error,
        created_at=row.created_at, delivered_at=row.delivered_at)


async def create_webhook(*, guard: Guard, db: Sessions, body: WebhookCreate) -> WebhookCreated:
    """Authorize the operator, then store the webhook; its secret is in this answer only."""
    events = [str(e) for e in body.events]
    await guard("create", KIND, attrs={"url": body.url, "events": events})
    secret = body.secret or secrets.token_urlsafe(32)
    webhook = await db.write(outbox.create_webhook, url=body.url, events=body.events,
                             secret=secret, description=body.description.strip(),
                             created_by=guard.principal.name)
    return WebhookCreated(**_fields(webhook), secret=secret)


async def list_webhooks(*, guard: Guard, db: Sessions,
                        include_disabled: bool) -> list[WebhookPublic]:
    """The webhooks (enabled ones, or all)."""
    await guard("read", KIND)
    rows = await db.read(outbox.list_webhooks, include_disabled=include_disabled)
    return [public(w) for w in rows]


async def get_webhook(*, guard: Guard, db: Sessions, webhook_id: str) -> WebhookPublic:
    """One webhook, or 404."""
    await guard("read", KIND, id=webhook_id)
    return public(await _existing(db, webhook_id))


async def disable_webhook(*, guard: Guard, db: Sessions, webhook_id: str) -> WebhookPublic:
    """Authorize the operator, then stop the webhook (nothing more is sent to it)."""
    await guard("delete", KIND, id=webhook_id)
    webhook = await db.write(outbox.disable_webhook, webhook_id=webhook_id,
                             disabled_by=guard.principal.name)
    if webhook is None:
        raise not_found(KIND, webhook_id)
    return public(webhook)


async def list_deliveries(*, guard: Guard, db: Sessions, webhook_id: str,
                          limit: int) -> list[DeliveryPublic]:
    """A webhook's deliveries, newest first."""
    await guard("read", KIND, id=webhook_id)
    await _existing(db, webhook_id)
    rows = await db.read(outbox.deliveries_of, webhook_id=webhook_id, limit=limit)
    return [_delivery(r) for r in rows]


async def _existing(db: Sessions, webhook_id: str) -> Webhook:
    webhook = await db.read(outbox.get_webhook, webhook_id=webhook_id)
    if webhook is None:
        raise not_found(KIND, webhook_id)
    return webhook
