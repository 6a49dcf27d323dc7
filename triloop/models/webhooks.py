"""Webhooks operators configure, and each event's delivery to each of them (migration 0030).

Only ``triloop_web`` reads or writes these tables: the shared secret that signs a
webhook's deliveries is stored here so the web service can sign each attempt, and no
other role may see it. A webhook is never deleted, only disabled, so its deliveries keep
naming it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Column, DateTime, Integer, UniqueConstraint, func
from sqlmodel import Field, SQLModel

from triloop.models._columns import created_at_field, json_field, text_array_field, timestamp_field


class Webhook(SQLModel, table=True):
    """An operator's subscription: which event kinds go to which URL, signed with which secret."""

    __tablename__ = "webhook"
    id: str = Field(primary_key=True)
    url: str
    events: list[str] = text_array_field()
    secret: str = Field(description="the shared secret each delivery is signed with (HMAC)")
    description: str = ""
    created_by: str
    created_at: datetime = created_at_field()
    disabled_at: datetime | None = timestamp_field()
    disabled_by: str | None = None
    # The audit log is read past this row for it: set to the head when the webhook is made,
    # so a new webhook hears of what happens from then on, not of the past.
    scanned_seq: int = Field(sa_column=Column(BigInteger, nullable=False))


class WebhookDelivery(SQLModel, table=True):
    """One event for one webhook: its body, and how its attempts went."""

    __tablename__ = "webhook_delivery"
    __table_args__ = (UniqueConstraint("webhook_id", "event_key"),)
    id: str = Field(primary_key=True)
    webhook_id: str = Field(foreign_key="webhook.id", index=True)
    event_kind: str = Field(description="a triloop.notifications.EventKind")
    event_key: str = Field(description="names the event once: a retried activity that audits"
                           " it twice still makes one delivery")
    audit_seq: int = Field(sa_column=Column(BigInteger, nullable=False))
    body: dict[str, Any] = json_field()
    status: str = Field(default="pending", description="pending | delivered | failed")
    attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    next_attempt_at: datetime = Field(sa_column=Column(
        DateTime(timezone=True), nullable=False, server_default=func.now()))
    last_status_code: int | None = None
    last_error: str | None = None
    created_at: datetime = created_at_field()
    delivered_at: datetime | None = timestamp_field()
