"""Episodes served under an injected fault can fail a candidate, never pass it.

The gates read real trajectory rows (written as the execution role) through the
governance activities, against the real PostgreSQL and OPA.
"""

from __future__ import annotations

import pytest

from governance_loop.contracts import ShadowInput
from tests.factories_governance import Scene, look_canary, write_episodes

pytestmark = pytest.mark.integration


def test_a_fault_on_production_cannot_pass_the_canary(scene: Scene) -> None:
    world = scene.world
    scene.episodes(world.candidate, "canary", [True] * 11 + [False])
    # Production degraded by a fault: every one of its episodes failed.
    scene.episodes(world.baseline, "production", [False] * 12, {
        "injected_fault": scene.fault(world.baseline)})
    scene.episodes(world.baseline, "production", [True] * 3)
    outcome = look_canary(scene, soak_complete=True)
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
    outcome = look_canary(scene, soak_complete=False)
    assert outcome.verdict == "abort_regression" and outcome.restore_routing
    _, reasons, evidence = scene.gate_row("canary")
    assert "served under an injected fault" in reasons[-1]
    assert evidence["injected_faults"] == [scene.fault(world.candidate)]


def test_shadow_pairs_with_a_faulted_side_never_count_toward_a_pass(scene: Scene) -> None:
    world = scene.world
    served = scene.episodes(world.baseline, "production", [False] * 6, {
        "injected_fault": scene.fault(world.baseline)})
    write_episodes(scene.execution, [
        {"id": f"{e}:shadow", "batch_id": e.rsplit(":", 2)[0], "task_id": world.task_ids[0],
         "checkpoint_id": world.candidate, "purpose": "shadow", "group_id": e,
         "success": True, "outcome": {"shadow_of": e}} for e in served],
        verifier=scene.verifier)
    outcome = scene.activities.decide_shadow(ShadowInput(
        promotion_id=scene.promotion_id, threshold_id=world.threshold_id,
        candidate_checkpoint_id=world.candidate, production_checkpoint_id=world.baseline,
        since=scene.since.isoformat()))
    assert (outcome.passed, outcome.verdict) == (False, "fail")
    _, reasons, evidence = scene.gate_row("shadow")
    assert evidence["episodes_under_fault"] == 6
    assert evidence["verdict_with_faulted_episodes"] == "pass"
    assert "never pass" in reasons[-1]
