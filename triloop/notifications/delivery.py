"""One attempt to deliver an event, and when to try again.

An attempt succeeds on any 2xx answer. Anything else (another status, a refused
connection, a timeout) is retried after ``retry_base_s * 2**(attempt - 1)`` seconds, at
most ``retry_max_s``, until ``max_attempts`` attempts have failed; then the delivery is
given up (``failed``) and stays on record with its last error.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from triloop.notifications.signing import signed_headers

MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class DeliveryPolicy:
    """How deliveries are sent and retried."""

    timeout_s: float = 5.0  # one attempt's HTTP timeout, seconds
    retry_base_s: float = 10.0  # wait after the first failed attempt, seconds (then doubled)
    retry_max_s: float = 3600.0  # longest wait between attempts, seconds
    max_attempts: int = 8  # attempts before a delivery is given up (count)
    batch: int = 20  # deliveries one dispatcher pass sends at most (count)

    def retry_delay_s(self, attempts: int) -> float | None:
        """Seconds to wait after ``attempts`` failed attempts; None: give up."""
        if attempts >= self.max_attempts:
            return None
        return float(min(self.retry_max_s, self.retry_base_s * 2 ** (attempts - 1)))

    @property
    def lease_s(self) -> float:
        """How long a claimed delivery is held by the process sending it (a process that
        dies mid-attempt leaves it to be retried after this)."""
        return self.timeout_s * 3 + 5


@dataclass(frozen=True)
class Attempt:
    """What one attempt got: the HTTP status if any answer came, and what went wrong."""

    delivered: bool
    status_code: int | None
    error: str | None


def attempt(client: httpx.Client, *, url: str, secret: str, body: bytes, event: str,
            delivery_id: str, timestamp: int) -> Attempt:
    """POST the signed body once; never raises for the receiver's failures."""
    headers = signed_headers(secret=secret, timestamp=timestamp, body=body, event=event,
                             delivery_id=delivery_id)
    try:
        response = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as error:
        return Attempt(False, None, f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS] or
                       type(error).__name__)
    if 200 <= response.status_code < 300:
        return Attempt(True, response.status_code, None)
    return Attempt(False, response.status_code,
                   f"HTTP {response.status_code}: {response.text[:200]}".strip())
