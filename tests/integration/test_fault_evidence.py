"""Episodes served under an injected fault can fail a candidate, never pass it.

The gates read real trajectory rows (written as the execution role) through the
governance activities, against the real PostgreSQL and OPA.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Engine, text

from governance_loop.activities.evidence import EvidenceActivities
from governance_loop.activities.messages import CanaryLook, ShadowInput
from tests.factories import insert, uid
from tests.factories_governance import PromotionWorld, make_world, write_episodes
from triloop.config import Settings
from triloop.wiring import build_authorizer

pytestmark = pytest.mark.integration


@dataclass
class Scene:
    """A promotion under judgement, the evidence activities, and the window's start."""

    owner: Engine
    execution: Engine
    world: PromotionWorld
    promotion_id: str
    activities: EvidenceActivities
    since: datetime

    def fault(self, checkpoint: str) -> dict[str, Any]:
        return {"checkpoint_id": checkpoint, "temperature": 8.0, "note": "game day"}

    def episodes(self, checkpoint: str, purpose: str, successes: list[bool],
                 outcome: dict[str, Any] | None = None) -> list[str]:
        ids = [uid("ep-") for _ in successes]
        write_episodes(self.execution, [
            {"id": e, "batch_id": "traffic", "task_id": self.world.task_ids[0],
             "checkpoint_id": checkpoint, "purpose": purpose, "group_id": e, "success": ok,
             "outcome": outcome or {}}
            for e, ok in zip(ids, successes, strict=True)])
        return ids

    def gate_row(self, gate: str) -> tuple[bool, list[str], dict[str, Any]]:
        with self.owner.connect() as conn:
            row = conn.execute(text(
                "SELECT passed, reasons, evidence FROM gate_result WHERE promotion_id = :p "
                "AND gate = :g"), {"p": self.promotion_id, "g": gate}).one()
        return bool(row[0]), list(row[1]), dict(row[2])


@pytest.fixture
def scene(settings: Settings, owner_engine: Engine, role_engine: Any) -> Scene:
    governance = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    world = make_world(owner_engine, governance, authorizer, threshold_name=uid("thr-"))
    promotion_id = uid("promo-")
    insert(owner_engine, "promotion", id=promotion_id, proposal_id=world.proposal_id,
           checkpoint_id=world.candidate, run_id=world.run_id, submitted_by=world.submitter,
           status="open")
    with owner_engine.connect() as conn:
        since = conn.execute(text("SELECT now()")).scalar_one()
    return Scene(owner_engine, role_engine("execution"), world, promotion_id,
                 EvidenceActivities(governance, authorizer), since)


def _canary(scene: Scene, *, soak_complete: bool) -> Any:
    return scene.activities.look_canary(CanaryLook(
        promotion_id=scene.promotion_id, threshold_id=scene.world.threshold_id,
        candidate_checkpoint_id=scene.world.candidate,
        production_checkpoint_id=scene.world.baseline, since=scene.since.isoformat(),
        soak_complete=soak_complete))


def test_a_fault_on_production_cannot_pass_the_canary(scene: Scene) -> None:
    world = scene.world
    scene.episodes(world.candidate, "canary", [True] * 11 + [False])
    # Production degraded by a fault: every one of its episodes failed.
    scene.episodes(world.baseline, "production", [False] * 12, {
        "injected_fault": scene.fault(world.baseline)})
    scene.episodes(world.baseline, "production", [True] * 3)
    outcome = _canary(scene, soak_complete=True)
    assert (outcome.passed, outcome.verdict) == (False, "fail")
    passed, reasons, evidence = scene.gate_row("canary")
    assert not passed and "too few episodes" in reasons[0]
    assert f"checkpoint {world.baseline} served at temperature 8.0 (game day)" in reasons[-1]
    assert evidence["injected_faults"] == [scene.fault(world.baseline)]
    assert evidence["episodes_under_fault"] == 12
    assert evidence["verdict_with_faulted_episodes"] == "pass"  # what it would have been


def test_a_fault_on_the_candidate_can_abort_the_canary(scene: Scene) -> None:
    world = scene.world
    scene.episodes(world.candidate, "canary", [False] * 12, {
        "injected_fault": scene.fault(world.candidate)})
    scene.episodes(world.baseline, "production", [True] * 12)
    outcome = _canary(scene, soak_complete=False)
    assert outcome.verdict == "abort_regression" and outcome.restore_routing
    _, reasons, evidence = scene.gate_row("canary")
    assert "served under an injected fault" in reasons[-1]
    assert evidence["injected_faults"] == [scene.fault(world.candidate)]


def test_shadow_pairs_with_a_faulted_side_never_count_toward_a_pass(scene: Scene) -> None:
    world = scene.world
    served = scene.episodes(world.baseline, "production", [False] * 6, {
        "injected_fault": scene.fault(world.baseline)})
    write_episodes(scene.execution, [
        {"id": f"{e}:shadow", "batch_id": "traffic", "task_id": world.task_ids[0],
         "checkpoint_id": world.candidate, "purpose": "shadow", "group_id": e,
         "success": True, "outcome": {"shadow_of": e}} for e in served])
    outcome = scene.activities.decide_shadow(ShadowInput(
        promotion_id=scene.promotion_id, threshold_id=world.threshold_id,
        candidate_checkpoint_id=world.candidate, production_checkpoint_id=world.baseline,
        since=scene.since.isoformat()))
    assert (outcome.passed, outcome.verdict) == (False, "fail")
    _, reasons, evidence = scene.gate_row("shadow")
    assert evidence["episodes_under_fault"] == 6
    assert evidence["verdict_with_faulted_episodes"] == "pass"
    assert "never pass" in reasons[-1]
