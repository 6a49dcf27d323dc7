"""Each delivery is signed: HMAC-SHA256 with the webhook's shared secret over the timestamp
and the body, so a receiver can tell triloop sent it, unchanged, recently.

Headers of every attempt:

- ``Triloop-Timestamp``: Unix seconds when the attempt was signed;
- ``Triloop-Signature``: ``v1=`` and the hex digest of
  ``HMAC-SHA256(secret, timestamp + "." + body)``;
- ``Triloop-Event``: the event kind; ``Triloop-Delivery``: the delivery's id (the same on
  every attempt, so a receiver can drop a repeat).

A receiver recomputes the digest over the raw body it read, compares in constant time and
refuses a timestamp older than its tolerance (a replayed request). ``verify`` does that.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

TIMESTAMP_HEADER = "Triloop-Timestamp"
SIGNATURE_HEADER = "Triloop-Signature"
EVENT_HEADER = "Triloop-Event"
DELIVERY_HEADER = "Triloop-Delivery"
SCHEME = "v1"
DEFAULT_TOLERANCE_S = 300


class SignatureInvalid(ValueError):
    """A delivery whose signature does not prove it; the message says what is wrong."""


def body_bytes(body: Mapping[str, Any]) -> bytes:
    """The bytes sent (and signed) for a body: compact JSON, keys sorted."""
    return json.dumps(dict(body), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """``v1=<hex HMAC-SHA256(secret, "<timestamp>." + body)>``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"{SCHEME}={digest.hexdigest()}"


def signed_headers(*, secret: str, timestamp: int, body: bytes, event: str,
                   delivery_id: str) -> dict[str, str]:
    """The headers of one attempt."""
    return {"Content-Type": "application/json", "User-Agent": "triloop-webhooks",
            TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: signature(secret, timestamp, body),
            EVENT_HEADER: event, DELIVERY_HEADER: delivery_id}


def verify(*, secret: str, body: bytes, headers: Mapping[str, str], now: float,
           tolerance_s: float = DEFAULT_TOLERANCE_S) -> None:
    """Raise ``SignatureInvalid`` unless the headers sign this body within the tolerance.

    ``headers`` is looked up case-insensitively (HTTP header names are).
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_timestamp = lowered.get(TIMESTAMP_HEADER.lower())
    given = lowered.get(SIGNATURE_HEADER.lower())
    if raw_timestamp is None or given is None:
        raise SignatureInvalid(f"the request has no {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}"
                               " header")
    try:
        timestamp = int(raw_timestamp)
    except ValueError:
        raise SignatureInvalid(f"{TIMESTAMP_HEADER} {raw_timestamp!r} is not Unix seconds"
                               ) from None
    if abs(now - timestamp) > tolerance_s:
        raise SignatureInvalid(f"{TIMESTAMP_HEADER} is {abs(now - timestamp):.0f}s from now,"
                               f" beyond the {tolerance_s:g}s tolerance (a replay?)")
    if not hmac.compare_digest(given, signature(secret, timestamp, body)):
        raise SignatureInvalid(f"{SIGNATURE_HEADER} does not match the body: another secret,"
                               " or the body changed on its way")
