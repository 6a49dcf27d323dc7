"""One pass of the webhook dispatcher: read new events, send what is due, record each try.

The process that runs it passes the web role's engine (the only role with the webhook
tables) and calls ``run_once`` on a timer. Several processes may run it at once: reading
on locks each webhook (skipping one another's), and each delivery is leased to one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from sqlalchemy import Engine

from triloop.db import session_scope
from triloop.notifications import outbox
from triloop.notifications.delivery import DeliveryPolicy, attempt
from triloop.notifications.signing import body_bytes


@dataclass(frozen=True)
class PassReport:
    """What one pass did (counts)."""

    enqueued: int
    delivered: int
    retrying: int
    gave_up: int


class Dispatcher:
    """Reads the audit log into deliveries and sends them, signed, with retries."""

    def __init__(self, engine: Engine, policy: DeliveryPolicy, *,
                 client: httpx.Client | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._engine = engine
        self._policy = policy
        self._client = client or httpx.Client(timeout=policy.timeout_s, follow_redirects=False)
        self._clock = clock

    def run_once(self) -> PassReport:
        """Enqueue the events audited since the last pass, then send every due delivery."""
        with session_scope(self._engine) as session:
            enqueued = outbox.enqueue_events(session=session)
        with session_scope(self._engine) as session:
            claimed = outbox.claim_due(session=session, policy=self._policy)
        outcomes = {"delivered": 0, "retrying": 0, "gave_up": 0}
        for delivery in claimed:
            result = attempt(self._client, url=delivery.url, secret=delivery.secret,
                             body=body_bytes(delivery.body), event=delivery.event_kind,
                             delivery_id=delivery.id, timestamp=int(self._clock()))
            with session_scope(self._engine) as session:
                outcome = outbox.finish_attempt(session=session, claimed=delivery,
                                                result=result, policy=self._policy)
            outcomes[outcome] += 1
        return PassReport(enqueued=enqueued, **outcomes)

    def close(self) -> None:
        """Close the HTTP client's connections."""
        self._client.close()
