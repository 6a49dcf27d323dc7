"""Offline eval counts only what governance asked for: its own batches, the arm's checkpoint.

The batches are recorded as their requesters record them (``rollout_batch``, written by
governance's own role, with the episodes it plans); episodes are real trajectory rows. A
batch someone else requested, or episodes another checkpoint served (which only the owner
can still insert), fail the gate, are left out of its statistics, and are audited as
integrity events."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import Engine, text

from governance_loop.contracts import OfflineEvalInput
from tests.factories import make_task, uid
from tests.factories_governance import Scene, look_canary, write_episodes

pytestmark = pytest.mark.integration


def _request(engine: Engine, scene: Scene, batch_id: str, checkpoint: str, *,
             requested_by: str = "governance", purpose: str = "eval", episodes: int = 30,
             task_id: str | None = None) -> str:
    """The batch's row with ``episodes`` planned episodes (on ``task_id``, default the eval
    set's first task), as ``engine``'s role records it."""
    task = task_id or scene.world.task_ids[0]
    plan = {f"{batch_id}:0:{i}": {"task_id": task, "seed": 0} for i in range(episodes)}
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO rollout_batch (id, purpose, checkpoint_id, requested_by, "
            "planned_episodes) VALUES (:b, :p, :c, :r, CAST(:plan AS jsonb))"),
            {"b": batch_id, "p": purpose, "c": checkpoint, "r": requested_by,
             "plan": json.dumps(plan)})
    return batch_id


def _episodes(engine: Engine, scene: Scene, batch_id: str, checkpoint: str,
              successes: list[bool], *, first: int = 0, purpose: str = "eval",
              task_id: str | None = None) -> None:
    """Planned episodes ``first``, ``first + 1``, ... of the batch."""
    write_episodes(engine, [
        {"id": f"{batch_id}:0:{first + i}", "batch_id": batch_id,
         "task_id": task_id or scene.world.task_ids[0], "checkpoint_id": checkpoint,
         "purpose": purpose,
         "group_id": f"{batch_id}:0", "success": ok}
        for i, ok in enumerate(successes)], verifier=scene.verifier)


def _judge(scene: Scene, candidate: str, production: str) -> Any:
    with scene.owner.begin() as conn:
        conn.execute(text("UPDATE promotion SET baseline_checkpoint_id = :b WHERE id = :p"),
                     {"b": scene.world.baseline, "p": scene.promotion_id})
    return scene.activities.decide_offline_eval(OfflineEvalInput(
        promotion_id=scene.promotion_id, threshold_id=scene.world.threshold_id,
        eval_set_id=scene.world.eval_set_id, candidate_batch_id=candidate,
        production_batch_id=production))


def _integrity_events(scene: Scene) -> list[str]:
    with scene.owner.connect() as conn:
        return [str(r[0]) for r in conn.execute(text(
            "SELECT payload->>'problem' FROM audit_event WHERE action = 'integrity_violation' "
            "AND resource->>'id' = :p ORDER BY seq"), {"p": scene.promotion_id})]


def test_batches_governance_asked_for_are_counted(scene: Scene) -> None:
    world = scene.world
    candidate = _request(scene.governance, scene, uid("eval-c-"), world.candidate)
    production = _request(scene.governance, scene, uid("eval-p-"), world.baseline)
    _episodes(scene.execution, scene, candidate, world.candidate, [True] * 30)
    _episodes(scene.execution, scene, production, world.baseline, [True] * 10 + [False] * 20)
    outcome = _judge(scene, candidate, production)
    passed, _, evidence = scene.gate_row("offline_eval")
    assert outcome.passed and passed
    assert evidence["batches_bound"]["requested_by"] == "governance"
    assert evidence["held_out"]["overlaps"] == [] and evidence["held_out"]["eval_tasks"] == 2
    assert _integrity_events(scene) == []


def test_a_batch_requested_by_learning_counts_for_nothing(scene: Scene) -> None:
    world = scene.world
    # Learning's training batch of the candidate, all successes, offered as eval evidence.
    # On a task outside the eval set: training on an eval task is refused outright (0022).
    trained_on = make_task(scene.owner)
    planted = _request(scene.execution, scene, uid("train-"), world.candidate,
                       requested_by="learning", purpose="training", task_id=trained_on)
    _episodes(scene.execution, scene, planted, world.candidate, [True] * 30, purpose="training",
              task_id=trained_on)
    production = _request(scene.governance, scene, uid("eval-p-"), world.baseline)
    _episodes(scene.execution, scene, production, world.baseline, [False] * 30)
    outcome = _judge(scene, planted, production)
    passed, reasons, evidence = scene.gate_row("offline_eval")
    assert not outcome.passed and not passed
    assert reasons == [f"integrity: batch {planted} was requested by learning for training of "
                       f"{world.candidate}, not by governance for eval of {world.candidate}"]
    assert evidence["integrity"] == [reasons[0].removeprefix("integrity: ")]
    assert _integrity_events(scene) == evidence["integrity"]


def test_episodes_another_checkpoint_served_are_not_counted(scene: Scene) -> None:
    world = scene.world
    candidate = _request(scene.governance, scene, uid("eval-c-"), world.candidate)
    production = _request(scene.governance, scene, uid("eval-p-"), world.baseline)
    _episodes(scene.execution, scene, candidate, world.candidate, [False] * 5)
    # Slipped in past the trigger (only the owner can): another checkpoint's successes.
    _episodes(scene.owner, scene, candidate, world.baseline, [True] * 25, first=5)
    _episodes(scene.execution, scene, production, world.baseline, [False] * 30)
    outcome = _judge(scene, candidate, production)
    passed, reasons, _ = scene.gate_row("offline_eval")
    assert not outcome.passed and not passed
    assert reasons == [f"integrity: 25 episodes of batch {candidate} were served by another "
                       f"checkpoint than {world.candidate}; not counted"]
    assert len(_integrity_events(scene)) == 1


def test_a_candidate_whose_run_trained_on_the_eval_set_fails(scene: Scene) -> None:
    world = scene.world
    with scene.owner.begin() as conn:  # the run trained on one of the eval set's tasks
        conn.execute(text("UPDATE training_run SET config = jsonb_build_object('rollout', "
                          "jsonb_build_object('task_ids', jsonb_build_array(CAST(:t AS text)))) "
                          "WHERE id = :r"), {"t": world.task_ids[0], "r": world.run_id})
    candidate = _request(scene.governance, scene, uid("eval-c-"), world.candidate)
    production = _request(scene.governance, scene, uid("eval-p-"), world.baseline)
    _episodes(scene.execution, scene, candidate, world.candidate, [True] * 30)
    _episodes(scene.execution, scene, production, world.baseline, [False] * 30)
    outcome = _judge(scene, candidate, production)
    passed, reasons, evidence = scene.gate_row("offline_eval")
    assert not outcome.passed and not passed
    assert reasons == [f"not held out: training task {world.task_ids[0]} is the same task"]
    assert evidence["held_out"]["overlaps"] == [reasons[0].removeprefix("not held out: ")]


def test_window_gates_count_only_traffic_somebody_asked_for(scene: Scene) -> None:
    world = scene.world
    scene.episodes(world.candidate, "canary", [False] * 10)   # requested production traffic
    scene.episodes(world.baseline, "production", [True] * 20)
    with scene.owner.begin() as conn:  # canary successes under a batch nobody asked for
        for _ in range(200):
            episode = uid("ghost-ep-")
            conn.execute(text(
                "INSERT INTO trajectory (id, batch_id, task_id, checkpoint_id, purpose, "
                "group_id, sample_index, policy_version, status, success, total_reward, "
                "num_steps) VALUES (:i, 'ghost-batch', :t, :c, 'canary', :i, 0, 0, "
                "'completed', true, 1.0, 1)"),
                {"i": episode, "t": world.task_ids[0], "c": world.candidate})
    look_canary(scene, soak_complete=True)
    _, _, evidence = scene.gate_row("canary")
    assert evidence["canary"]["episodes"] == 10 and evidence["canary"]["successes"] == 0
    # Left out, and said so: the gate's evidence counts them and the audit log names them.
    assert evidence["left_out_unrequested"] == 200
    assert _integrity_events(scene) == ["200 episodes outside any requested batch; not counted"]


def test_window_gates_with_only_requested_traffic_audit_nothing(scene: Scene) -> None:
    world = scene.world
    scene.episodes(world.candidate, "canary", [True] * 10)
    scene.episodes(world.baseline, "production", [True] * 20)
    look_canary(scene, soak_complete=True)
    _, _, evidence = scene.gate_row("canary")
    assert evidence["left_out_unrequested"] == 0
    assert _integrity_events(scene) == []
