"""Which checkpoint serves a production episode: read from governance's tables, never chosen here.

Governance writes ``routing`` (slots ``production``, ``canary`` with its share,
``shadow``) and ``deployment`` (the ``production`` alias). The execution loop only
reads them. The ``production`` routing slot wins; without one the ``production``
alias serves. A canary takes the episodes whose id hashes below its share, so the
split is deterministic (a retried or replayed batch routes every episode the same
way) and independent of arrival order. A shadow checkpoint runs beside every
episode the production slot serves (canary episodes are not shadowed: the shadow
gate compares a candidate against production, not against another candidate).

A shadow episode plays the same task and seed in its own environment copy, so its
actions never touch the production episode. Its steps are compared with
production's while both saw the same situation (same observation history hash);
after the copies diverge, steps are no longer compared.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session

from execution_loop.store import load_steps
from triloop.models import Deployment, Trajectory
from triloop.routing_claims import serving_slots
from triloop.statuses import Purpose

PRODUCTION, CANARY, SHADOW = Purpose.PRODUCTION, Purpose.CANARY, Purpose.SHADOW


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
    """Read the routing slots and the production alias (one snapshot per batch).

    A shadow or canary claim of a promotion that ended, or whose claim expired, serves
    nothing (``triloop.routing_claims``): a terminated promotion leaves no routing behind.
    """
    with Session(engine) as session:
        slots = serving_slots(session)
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


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def situation_hashes(initial_sha256: str, observations: Sequence[str]) -> list[str]:
    """sha256 of what the agent saw before each step: the initial observation, then replies."""
    return [initial_sha256, *(_sha(o) for o in observations[:-1])][: len(observations)]


def step_agreement(
    production: Sequence[tuple[str, str]], shadow: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Per shadow step: compared when both saw the same situation, agreed when they acted alike.

    Each side is ``[(situation sha256, action text), ...]`` by step index. Once the shadow's
    own environment copy has diverged, its steps are not compared (``compared`` False).
    """
    rows: list[dict[str, Any]] = []
    for index, (situation, action) in enumerate(shadow):
        other = production[index] if index < len(production) else None
        compared = other is not None and other[0] == situation
        agreed = compared and other is not None and other[1].strip() == action.strip()
        rows.append({
            "compared": compared,
            "agreed": agreed,
            "production_action": other[1] if other is not None else None,
        })
    return rows


def shadow_comparison(
    *,
    engine: Engine,
    production_id: str,
    initial_sha256: str,
    observations: Sequence[str],
    actions: Sequence[str],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Outcome fields and per-step feedback of a shadow episode against its production one."""
    with Session(engine) as session:
        production = session.get(Trajectory, production_id)
        if production is None:
            raise LookupError(
                f"shadow of {production_id!r}: the production episode is not stored, so "
                "there is nothing to compare with"
            )
        steps = load_steps(session=session, trajectory_id=production_id)
    produced_initial = str(production.outcome.get("initial_observation_sha256", ""))
    production_side = list(zip(
        situation_hashes(produced_initial, [s.observation for s in steps]),
        [s.action_text for s in steps], strict=True,
    ))
    shadow_side = list(zip(situation_hashes(initial_sha256, observations), actions, strict=True))
    per_step = step_agreement(production_side, shadow_side)
    compared = sum(1 for s in per_step if s["compared"])
    agreed = sum(1 for s in per_step if s["agreed"])
    outcome = {
        "shadow_of": production_id,
        "production_checkpoint_id": production.checkpoint_id,
        "production_reward": production.total_reward,
        "production_success": production.success,
        "steps_compared": compared,
        "steps_agreed": agreed,
        "agreement": agreed / compared if compared else None,
    }
    return outcome, [{"shadow_agreement": s} for s in per_step]
