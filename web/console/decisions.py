"""Which decision forms a person sees on a promotion, why the others are withheld, and
which promotions wait for them.

A form is shown only when the promotion is open, at the gate the decision belongs to,
and the policy (asked without auditing: it is only a hint) would allow this person to
take it. The policy is asked with the facts governance will check again: the duties
(who submitted, who signed the audit) and the role's age (when the promotion opened,
when the person's role for the decision became active; a role must predate the
promotion it decides on). So the page offers no decision governance would refuse, and
a decision it withholds comes with the policy's reasons. The server still authorizes
the POST itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from triloop.statuses import PromotionDecision, PromotionStatus
from web.data import promotions
from web.data.promotions import DecisionFacts, PromotionSummary
from web.deps import Guard, Sessions

# The gates where a person decides.
HUMAN_GATES = frozenset(decision.gate for decision in PromotionDecision)


@dataclass(frozen=True)
class Withheld:
    """A decision at the promotion's gate this person may not take, with the policy's why."""

    decision: PromotionDecision
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Offer:
    """What a promotion page offers this person now, and what it withholds."""

    decisions: list[PromotionDecision] = field(default_factory=list)
    withheld: list[Withheld] = field(default_factory=list)

    def withheld_reasons(self) -> list[str]:
        """Every reason the policy gave for a withheld decision, each once, in order."""
        return list(dict.fromkeys(r for w in self.withheld for r in w.reasons))


@dataclass(frozen=True)
class Waiting:
    """An open promotion this person can decide now."""

    promotion: PromotionSummary
    decisions: list[PromotionDecision]


async def offer_for(guard: Guard, facts: DecisionFacts) -> Offer:
    """The decisions this person may take on this promotion now, and the others at its gate
    with the policy's reasons. ``facts`` are read for this person
    (``decision_facts(user=...)``), so the role's age is asked about."""
    promotion = facts.promotion
    if promotion.status != PromotionStatus.open or promotion.workflow_id is None:
        return Offer()
    offer = Offer()
    for decision in PromotionDecision:
        if promotion.current_gate != decision.gate:
            continue
        answer = await guard.hint(decision, "promotion", id=promotion.id,
                                  attrs=facts.policy_attrs(decision))
        if answer.allow:
            offer.decisions.append(decision)
        else:
            offer.withheld.append(Withheld(decision, answer.reasons or ("no reason given",)))
    return offer


async def decisions_for(guard: Guard, facts: DecisionFacts) -> list[PromotionDecision]:
    """The decisions this person may take on this promotion now."""
    return (await offer_for(guard, facts)).decisions


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
        facts = await db.read(promotions.decision_facts, promotion_id=promotion.id,
                              user=guard.principal.name)
        if facts is None:
            continue
        decisions = await decisions_for(guard, facts)
        if decisions:
            waiting.append(Waiting(promotion=promotion, decisions=decisions))
    return waiting
