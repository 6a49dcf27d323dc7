"""``/api/webhooks``: operators configure webhooks; operators and auditors read them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from web import webhooks
from web.deps import AuthorizeDep, SessionDep
from web.pagination import LimitParam
from web.webhooks import DeliveryPublic, WebhookCreate, WebhookCreated, WebhookPublic

router = APIRouter(prefix="/api/webhooks", tags=["webhooks"])

WebhookId = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_-]+$")]


@router.get("", response_model=list[WebhookPublic])
async def list_webhooks(
    guard: AuthorizeDep, db: SessionDep,
    include_disabled: Annotated[bool, Query(description="list disabled ones too")] = False,
) -> list[WebhookPublic]:
    """The webhooks events are sent to, newest first (never their secrets)."""
    return await webhooks.list_webhooks(guard=guard, db=db, include_disabled=include_disabled)


@router.post("", status_code=201, response_model=WebhookCreated)
async def create_webhook(body: WebhookCreate, guard: AuthorizeDep,
                         db: SessionDep) -> WebhookCreated:
    """Send these kinds of event to a URL, signed with a shared secret (shown once)."""
    return await webhooks.create_webhook(guard=guard, db=db, body=body)


@router.get("/{webhook_id}", response_model=WebhookPublic)
async def get_webhook(webhook_id: WebhookId, guard: AuthorizeDep,
                      db: SessionDep) -> WebhookPublic:
    """One webhook."""
    return await webhooks.get_webhook(guard=guard, db=db, webhook_id=webhook_id)


@router.delete("/{webhook_id}", response_model=WebhookPublic)
async def disable_webhook(webhook_id: WebhookId, guard: AuthorizeDep,
                          db: SessionDep) -> WebhookPublic:
    """Stop sending to a webhook; it and its deliveries stay on record."""
    return await webhooks.disable_webhook(guard=guard, db=db, webhook_id=webhook_id)


@router.get("/{webhook_id}/deliveries", response_model=list[DeliveryPublic])
async def list_deliveries(webhook_id: WebhookId, guard: AuthorizeDep, db: SessionDep,
                          limit: LimitParam = 50) -> list[DeliveryPublic]:
    """The events owed to a webhook, newest first, with how each attempt went."""
    return await webhooks.list_deliveries(guard=guard, db=db, webhook_id=webhook_id,
                                          limit=limit)
