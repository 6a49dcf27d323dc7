"""Which checkpoint serves a production episode: read from governance's tables, never chosen here.

Governance writes ``routing`` (slots ``production``, ``canary`` with its share,
``shadow``) and ``deployment`` (the ``production`` alias). The execution loop only
reads them. The ``production`` routing slot wins; without one the ``production``
alias serves. A canary takes the episodes whose id hashes below its share, so the
split is deterministic (a retried or replayed batch routes every episode the same
way) and independent of arrival order. A shadow checkpoint runs beside every
episode the production slot serves (canary episodes are not shadowed: the shadow
gate compares a candidate against production, not against another candidate).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlmodel import Session, select

from triloop.models import Deployment, Routing

PRODUCTION = "production"
CANARY = "canary"
SHADOW = "shadow"


class NoProductionCheckpoint(LookupError):
    """Production traffic arrived but governance routes it to no checkpoint."""


@dataclass(frozen=True)
class Routes:
    """A snapshot of governance's routing for production traffic."""

    production: str | None
    canary: str | None = None
    canary_share: float = 0.0  # fraction of production episodes the canary serves, 0..1
    shadow: str | None = None


@dataclass(frozen=True)
class Assignment:
    """Who serves one production episode, and who shadows it."""

    checkpoint_id: str
    purpose: str  # production | canary
    shadow_checkpoint_id: str | None = None


def canary_bucket(episode_id: str) -> float:
    """A uniform number in [0, 1) fixed by the episode id (sha256, first 64 bits)."""
    digest = hashlib.sha256(episode_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign(episode_id: str, routes: Routes) -> Assignment:
    """Route one production episode; raises ``NoProductionCheckpoint`` when nothing serves."""
    share = routes.canary_share if math.isfinite(routes.canary_share) else 0.0
    if routes.canary and canary_bucket(episode_id) < min(max(share, 0.0), 1.0):
        return Assignment(checkpoint_id=routes.canary, purpose=CANARY)
    if routes.production is None:
        raise NoProductionCheckpoint(
            "no checkpoint serves production: governance has set neither a 'production' "
            "routing slot nor a 'production' deployment alias; promote a checkpoint first"
        )
    shadow = routes.shadow if routes.shadow != routes.production else None
    return Assignment(
        checkpoint_id=routes.production, purpose=PRODUCTION, shadow_checkpoint_id=shadow
    )


def read_routes(engine: Engine) -> Routes:
    """Read the routing slots and the production alias (one snapshot per batch)."""
    with Session(engine) as session:
        slots = {row.slot: row for row in session.exec(select(Routing)).all()}
        alias = session.get(Deployment, PRODUCTION)
    production_slot = slots.get(PRODUCTION)
    production = production_slot.checkpoint_id if production_slot else None
    if production is None and alias is not None:
        production = alias.checkpoint_id
    canary = slots.get(CANARY)
    shadow = slots.get(SHADOW)
    return Routes(
        production=production,
        canary=canary.checkpoint_id if canary else None,
        canary_share=float(canary.share) if canary and canary.checkpoint_id else 0.0,
        shadow=shadow.checkpoint_id if shadow else None,
    )
