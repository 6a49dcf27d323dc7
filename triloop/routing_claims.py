"""Which routing slots serve now: a promotion's shadow or canary claim clears itself.

Governance claims the shadow or canary slot for a promotion (``routing.promotion_id``) until
``routing.claim_expires_at`` (the gate's soak plus a grace, on the database clock). A
promotion that ends by its own code releases the slot; one that is terminated runs no code
at all, and before this rule its claim served the candidate forever. So every reader
(the execution loop's router, governance's own checks, the console) counts a claim only
while

- its promotion row is open (a rejected, rolled-back, terminated ... promotion holds
  nothing, whatever the row still says), and
- the claim has not expired (this holds even when no governance process runs to notice
  that the promotion's workflow ended).

A slot that names no promotion (production; a trial an operator routed by hand on a
development stack) serves as stored. The rule is ``claim_lapsed``; ``serving_slots`` is
the one read every reader uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlmodel import Session

from triloop.statuses import PromotionStatus, Purpose


@dataclass(frozen=True)
class ServingSlot:
    """A routing slot as it serves now (``checkpoint_id`` None when its claim lapsed)."""

    slot: str
    checkpoint_id: str | None
    share: float
    promotion_id: str | None
    updated_at: datetime
    lapsed: str | None = None  # why the stored claim no longer serves, when it does not


def claim_lapsed(
    *, slot: str, checkpoint_id: str | None, promotion_id: str | None,
    promotion_status: str | None, expires_at: datetime | None, now: datetime,
) -> str | None:
    """Why a stored claim no longer serves, or None while it does (or there is none)."""
    if checkpoint_id is None or slot == Purpose.PRODUCTION or promotion_id is None:
        return None
    if promotion_status != PromotionStatus.open:
        ended = "does not exist" if promotion_status is None else f"ended {promotion_status}"
        return f"promotion {promotion_id} {ended}: its {slot} claim no longer serves"
    if expires_at is not None and expires_at <= now:
        return (f"promotion {promotion_id}'s {slot} claim expired at {expires_at.isoformat()}"
                " (its workflow did not release it in time)")
    return None


_SLOTS = text("""
    SELECT r.slot, r.checkpoint_id, r.share, r.promotion_id, r.updated_at,
           r.claim_expires_at, p.status, now() AS db_now
    FROM routing r LEFT JOIN promotion p ON p.id = r.promotion_id
""")


def serving_slots(session: Session) -> dict[str, ServingSlot]:
    """Every routing slot by name, with lapsed claims emptied (database clock)."""
    slots: dict[str, ServingSlot] = {}
    for row in session.execute(_SLOTS).all():
        lapsed = claim_lapsed(slot=row.slot, checkpoint_id=row.checkpoint_id,
                              promotion_id=row.promotion_id, promotion_status=row.status,
                              expires_at=row.claim_expires_at, now=row.db_now)
        slots[row.slot] = ServingSlot(
            slot=row.slot, checkpoint_id=None if lapsed else row.checkpoint_id,
            share=0.0 if lapsed else float(row.share), promotion_id=row.promotion_id,
            updated_at=row.updated_at, lapsed=lapsed)
    return slots
