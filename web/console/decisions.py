"""Which decision forms a person sees on a promotion, and which promotions wait for them.

A form is shown only when the promotion is open, at the gate the decision
belongs to, and the policy (asked without auditing: it is only a hint) would
allow this person to take it. The server still authorizes the POST itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from web.data import promotions
from web.data.promotions import DecisionFacts, PromotionSummary
from web.deps import Guard, Sessions

# decision -> gate at which it can be taken
DECISION_GATE = {"sign_audit": "audit", "reject_audit": "audit",
                 "approve": "approval", "reject": "approval", "override_alarms": "stability"}


@dataclass(frozen=True)
class Waiting:
    """An open promotion this person can decide now."""

    promotion: PromotionSummary
    decisions: list[str]


def facts_attrs(facts: DecisionFacts) -> dict[str, str]:
    """The duty facts the policy needs about a promotion."""
    attrs = {"submitted_by": facts.promotion.submitted_by}
    if facts.audited_by:
        attrs["audited_by"] = facts.audited_by
    return attrs


async def decisions_for(guard: Guard, facts: DecisionFacts) -> list[str]:
    """The decisions this person may take on this promotion now."""
    promotion = facts.promotion
    if promotion.status != "open" or promotion.workflow_id is None:
        return []
    allowed = []
    for decision, gate in DECISION_GATE.items():
        if promotion.current_gate != gate:
            continue
        if await guard.would_allow(decision, "promotion", id=promotion.id,
                                   attrs=facts_attrs(facts)):
            allowed.append(decision)
    return allowed


async def awaiting_me(guard: Guard, db: Sessions, limit: int = 20) -> list[Waiting]:
    """Open promotions at a gate where this person could decide."""
    if not await guard.would_allow("read", "promotion"):
        return []
    listing = await db.read(promotions.list_promotions, limit=limit, cursor=None, status="open")
    waiting = []
    for promotion in listing.items:
        if promotion.current_gate not in ("audit", "approval", "stability"):
            continue
        facts = await db.read(promotions.decision_facts, promotion_id=promotion.id)
        if facts is None:
            continue
        decisions = await decisions_for(guard, facts)
        if decisions:
            waiting.append(Waiting(promotion=promotion, decisions=decisions))
    return waiting
