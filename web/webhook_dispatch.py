"""The web service sends webhooks: a dispatcher pass every ``webhook_poll_s`` seconds.

It runs beside the app for as long as the app is served (its lifespan), with the web
role's engine, the only role that holds the webhook tables. A pass that fails (the
database away) is logged and the next one tries again: deliveries are durable rows, so
nothing is lost meanwhile. ``webhook_poll_s = 0`` runs none in this process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from triloop.config import Settings
from triloop.notifications.delivery import DeliveryPolicy
from triloop.notifications.dispatcher import Dispatcher
from web.deps import WebServices

log = logging.getLogger("triloop.web.webhooks")


def delivery_policy(settings: Settings) -> DeliveryPolicy:
    """The settings' timeout and retry schedule."""
    return DeliveryPolicy(timeout_s=settings.webhook_timeout_s,
                          retry_base_s=settings.webhook_retry_base_s,
                          retry_max_s=settings.webhook_retry_max_s,
                          max_attempts=settings.webhook_max_attempts)


async def dispatch_forever(dispatcher: Dispatcher, poll_s: float) -> None:
    """A pass, then a pause, until cancelled."""
    while True:
        try:
            await asyncio.to_thread(dispatcher.run_once)
        except Exception:  # keep sending: the next pass retries what this one could not
            log.exception("webhook dispatch pass failed; retrying in %.1fs", poll_s)
        await asyncio.sleep(poll_s)


@asynccontextmanager
async def webhook_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Run the dispatcher while the app is served."""
    services: WebServices = app.state.services
    poll_s = services.settings.webhook_poll_s
    if poll_s <= 0:
        yield
        return
    dispatcher = Dispatcher(services.engine, delivery_policy(services.settings))
    task = asyncio.create_task(dispatch_forever(dispatcher, poll_s), name="webhook-dispatch")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        dispatcher.close()
