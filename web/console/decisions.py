"""Which decision forms a person sees on a promotion, and which promotions wait for them.

A form is shown only when the promotion is open, at the gate the decision
belongs to, and the policy (asked without auditing: it is only a hint) would
allow this person to take it. The server still authorizes the POST itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from triloop.statuses import PromotionDecision, PromotionStatus
from web.data import promotions
from web.data.promotions import DecisionFacts, PromotionSummary
from web.deps import Guard, Sessions

# The gates where a person decides.
HUMAN_GATES = frozenset(decision.gate for decision in PromotionDecision)


@dataclass(frozen=True)
class Waiting:
    """An open promotion this person can decide now."""

    promotion: PromotionSummary
    decisions: list[PromotionDecision]


async def decisions_for(guard: Guard, facts: DecisionFacts) -> list[PromotionDecision]:
    """The decisions this person may take on this promotion now."""
    promotion = facts.promotion
    if promotion.status != PromotionStatus.open or promotion.workflow_id is None:
        return []
    allowed = []
    for decision in PromotionDecision:
        if promotion.current_gate != decision.gate:
            continue
        if await guard.would_allow(decision, "promotion", id=promotion.id,
                                   attrs=facts.policy_attrs()):
            allowed.append(decision)
    return allowed


async def awaiting_me(guard: Guard, db: Sessions, limit: int = 20) -> list[Waiting]:
    """Open promotions at a gate where this person could decide."""
    if not await guard.would_allow("read", "promotion"):
        return []
    listing = await db.read(promotions.list_promotions, limit=limit, cursor=None,
                            status=PromotionStatus.open)
    waiting = []
    for promotion in listing.items:
        if promotion.current_gate not in HUMAN_GATES:
            continue
        facts = await db.read(promotions.decision_facts, promotion_id=promotion.id)
        if facts is None:
            continue
        decisions = await decisions_for(guard, facts)
        if decisions:
            waiting.append(Waiting(promotion=promotion, decisions=decisions))
    return waiting
