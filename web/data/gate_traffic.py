"""How far an open shadow or canary gate is from the production traffic it needs.

The gates judge only requested production episodes served since they took their routing
slot; this module counts the same episodes, with the kernel's SQL
(``triloop.production_traffic``), against the threshold version's ``min_samples``, so the
API and the console can say "waiting for production traffic: 3 of 12 paired episodes"
while the soak runs instead of only after the gate failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

from triloop.models import GateResult, Promotion, Routing, Threshold
from triloop.production_traffic import (
    CANARY_PURPOSES,
    count_requested_episodes,
    count_shadow_pairs,
)
from triloop.statuses import Gate, PromotionStatus, Purpose

TRAFFIC_GATES = (Gate.SHADOW, Gate.CANARY)
# The threshold key that sets each gate's bar, in the gate's own section of the version.
_BAR = {"shadow": "min_samples", "canary": "min_samples_per_arm"}


class TrafficProgress(BaseModel):
    """The production episodes an open shadow or canary gate has counted so far."""

    gate: str = Field(description="shadow | canary")
    slot_held: bool = Field(description="the gate holds its routing slot, so traffic counts")
    slot_holder: str | None = Field(
        default=None, description="the promotion holding the slot while this one waits for it")
    since: datetime | None = Field(
        default=None, description="when the gate took its slot; episodes before do not count")
    threshold_id: str | None = None
    needed: int | None = Field(
        default=None, description="shadow.min_samples, or canary.min_samples_per_arm "
        "(null when the threshold version leaves it to governance's default)")
    counted: int = Field(
        description="paired episodes (shadow), or episodes in the smaller arm (canary)")
    arms: dict[str, int] | None = Field(
        default=None, description="canary: episodes per arm (canary, production)")
    enough: bool = Field(description="counted has reached needed; the soak decides the rest")
    message: str


def traffic_progress(*, session: Session, promotion: Promotion) -> TrafficProgress | None:
    """The traffic count of an open promotion at shadow or canary; None at any other gate."""
    gate = promotion.current_gate
    if promotion.status != PromotionStatus.open or gate not in TRAFFIC_GATES:
        return None
    threshold = _threshold(session, promotion.id)
    needed = _needed(gate, threshold.spec if threshold is not None else None)
    threshold_id = threshold.id if threshold is not None else None
    slot = session.exec(select(Routing).where(Routing.slot == gate)).first()
    holds = (slot is not None and slot.checkpoint_id == promotion.checkpoint_id
             and slot.promotion_id == promotion.id)
    if slot is None or not holds or promotion.baseline_checkpoint_id is None:
        holder = slot.promotion_id if slot is not None and slot.checkpoint_id else None
        waiting = f", held by promotion {holder}" if holder else ""
        return TrafficProgress(
            gate=gate, slot_held=False, slot_holder=holder, threshold_id=threshold_id,
            needed=needed, counted=0, enough=False,
            message=f"waiting for the {gate} slot{waiting}: no production traffic counts "
                    "toward this gate until it holds the slot")
    since = slot.updated_at
    arms = None
    if gate == "shadow":
        counted = count_shadow_pairs(session=session, candidate_id=promotion.checkpoint_id,
                                     production_id=promotion.baseline_checkpoint_id,
                                     since=since)
        unit = "paired episodes"
    else:
        arms = {
            "canary": count_requested_episodes(
                session=session, checkpoint_id=promotion.checkpoint_id,
                purposes=CANARY_PURPOSES, since=since),
            "production": count_requested_episodes(
                session=session, checkpoint_id=promotion.baseline_checkpoint_id,
                purposes=(Purpose.PRODUCTION,), since=since),
        }
        counted = min(arms.values())
        unit = (f"episodes in the smaller arm (canary {arms['canary']}, "
                f"production {arms['production']})")
    enough = needed is not None and counted >= needed
    of = f" of {needed}" if needed is not None else ""
    message = (f"production traffic is enough: {counted}{of} {unit}; the gate decides at the "
               "end of its soak" if enough else
               f"waiting for production traffic: {counted}{of} {unit}")
    return TrafficProgress(gate=gate, slot_held=True, since=since, threshold_id=threshold_id,
                           needed=needed, counted=counted, arms=arms, enough=enough,
                           message=message)


def _threshold(session: Session, promotion_id: str) -> Threshold | None:
    """The threshold version this promotion is judged by, as its earlier gates recorded it."""
    threshold_id = session.exec(
        select(GateResult.threshold_id).where(GateResult.promotion_id == promotion_id)
        .where(col(GateResult.threshold_id).is_not(None))
        .order_by(col(GateResult.created_at).desc())
    ).first()
    return session.get(Threshold, threshold_id) if threshold_id is not None else None


def _needed(gate: str, spec: Mapping[str, Any] | None) -> int | None:
    section = (spec or {}).get(gate)
    value = section.get(_BAR[gate]) if isinstance(section, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
