"""Issue 27, item 1 through the stored rows: offline eval reads the verifier's reward terms.

Real frozen_lake episodes on the demo's held-out maps are stored as the execution role writes
them (honest rows: what each game earns); the real verifier (the session's
``verifier_service``) replays each one and writes its verdict, whose ``details.terms``
splits the reward by term. The real ``EvidenceActivities.decide_offline_eval`` then judges
the two eval batches against a threshold with attribution on (the default): a shortcut
candidate whose reward rose on progress and format alone is held, the stored gate row naming
the shaping terms; an honest candidate that reaches more goals passes.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlmodel import Session

from governance_loop import store
from governance_loop.contracts import OfflineEvalInput, ShadowInput
from governance_loop.evalsets import store_eval_set, store_threshold
from scripts.demo_world import DEMO_THRESHOLDS
from tests.factories import uid
from tests.factories_execution import make_task_on, register_builtin
from tests.factories_governance import Scene, look_canary, write_episodes
from tests.frozen_lake_scripted import Policy, base, honest, shortcut
from triloop.episode_plan import planned_episodes
from triloop.workflow_api import RolloutBatchInput, RolloutItem

pytestmark = pytest.mark.integration

# Maps of the demo's shipped contract, as its held-out maps are, but on seeds no other test
# plays: the session's database is shared, and an eval set refuses a map some earlier test
# trained on (held out by content), as it should.
EVAL_SEEDS = (7021, 7022, 7023, 7024)
EPISODES_PER_MAP = 4  # as the demo's offline eval plays its 4 maps for min_samples 16


def _play(scene: Scene, tasks: dict[str, int], checkpoint: str, policy: Policy) -> str:
    """Governance's eval batch on ``checkpoint``, its episodes stored as ``policy`` played
    them; returns the batch id."""
    from execution_loop.environments.registry import get_environment
    from verifier.replay import replay_and_judge

    batch = RolloutBatchInput(batch_id=uid("eval-"), purpose="eval", checkpoint_id=checkpoint,
                              items=[RolloutItem(task, seed, group_size=EPISODES_PER_MAP)
                                     for task, seed in tasks.items()])
    with Session(scene.governance) as session:
        store.record_rollout_batch(session=session, batch=batch)
        session.commit()
    with scene.execution.begin() as conn:
        for planned in planned_episodes(batch):
            actions = policy(planned.seed, planned.sample_index)
            played = replay_and_judge(get_environment("frozen_lake")(), seed=planned.seed,
                                      actions=actions)
            conn.execute(text(
                "INSERT INTO trajectory (id, batch_id, task_id, checkpoint_id, purpose, "
                "group_id, sample_index, policy_version, status, success, total_reward, "
                "num_steps) VALUES (:i, :b, :t, :c, 'eval', :g, :n, 0, 'completed', :s, :r, "
                ":k)"),
                {"i": planned.episode_id, "b": batch.batch_id, "t": planned.task_id,
                 "c": checkpoint, "g": planned.group_id, "n": planned.sample_index,
                 "s": played.success, "r": played.total_reward, "k": len(actions)})
            for index, action in enumerate(actions):
                conn.execute(text(
                    "INSERT INTO step (trajectory_id, index, observation, action_text, reward, "
                    "done) VALUES (:i, :x, '', :a, 0, :d)"),
                    {"i": planned.episode_id, "x": index, "a": action,
                     "d": index == len(actions) - 1})
    return batch.batch_id


def _judged(owner: Engine, verifier: Engine, batch_ids: list[str]) -> dict[str, Any]:
    """The verifier's verdict details on the batches' episodes, once it has judged all.

    The test runs the verifier's own pass (``verify_pending``, as its role) beside the
    session's verifier thread rather than waiting a fixed time for that thread: under load
    32 replays (one child interpreter each) take longer than any fixed wait. The guard
    against a hang is the pytest timeout."""
    from execution_loop.serving import TaskEnvironments
    from verifier.service import verify_pending

    environments = TaskEnvironments(engine=verifier)
    while True:
        with owner.connect() as conn:
            rows = conn.execute(text(
                "SELECT t.id, v.details FROM trajectory t LEFT JOIN verdict v "
                "ON v.trajectory_id = t.id WHERE t.batch_id = ANY(:b)"),
                {"b": batch_ids}).all()
        if all(r[1] is not None for r in rows):
            return {str(r[0]): r[1] for r in rows}
        if verify_pending(engine=verifier, environments=environments) == 0:
            time.sleep(0.1)  # the session's verifier holds the rest: it is judging them


def _decide(scene: Scene, candidate: Policy) -> tuple[bool, list[str], dict[str, Any]]:
    world = scene.world
    version = register_builtin(scene.owner, "frozen_lake")
    tasks = {make_task_on(scene.owner, version, seed=seed): seed for seed in EVAL_SEEDS}
    eval_set = store_eval_set(engine=scene.governance, name=uid("es-"),
                              task_ids=list(tasks), requested_by="gov-admin").id
    threshold = store_threshold(engine=scene.governance, name=uid("thr-"),
                                spec={"version": "x", **DEMO_THRESHOLDS},
                                eval_set_id=eval_set, requested_by="gov-admin")
    assert threshold.spec["attribution"]["min_task_share"] == 0.5
    mine = _play(scene, tasks, world.candidate, candidate)
    theirs = _play(scene, tasks, world.baseline, base)
    details = _judged(scene.owner, scene.verifier, [mine, theirs])
    assert all("terms" in d for d in details.values())
    with scene.owner.begin() as conn:
        conn.execute(text("UPDATE promotion SET baseline_checkpoint_id = :b WHERE id = :p"),
                     {"b": world.baseline, "p": scene.promotion_id})
    scene.activities.decide_offline_eval(OfflineEvalInput(
        promotion_id=scene.promotion_id, threshold_id=threshold.id, eval_set_id=eval_set,
        eval_set_ids=[eval_set], candidate_batch_id=mine, production_batch_id=theirs))
    return scene.gate_row("offline_eval")


def test_offline_eval_holds_a_shortcut_naming_the_shaping_terms_from_stored_verdicts(
    scene: Scene,
) -> None:
    passed, reasons, evidence = _decide(scene, shortcut)
    assert not passed
    assert len(reasons) == 1 and "only 0.0% of the gain came from the task term" in reasons[0]
    assert "progress (+" in reasons[0] and "invalid_action (+" in reasons[0]
    attribution = evidence["eval_sets"][0]["attribution"]
    assert attribution["shaping_only"] is True
    assert {r["term"]: r["kind"] for r in attribution["terms"]}["progress"] == "shaping"
    assert {r["term"]: r["kind"] for r in attribution["terms"]}["valid_action"] == "process"


def test_offline_eval_passes_an_honest_candidate_that_reaches_more_goals(scene: Scene) -> None:
    passed, reasons, evidence = _decide(scene, honest)
    assert passed, reasons
    judged = evidence["eval_sets"][0]
    assert judged["candidate"]["successes"] == 8 and judged["production"]["successes"] == 0
    assert judged["attribution"]["task_share"] >= 0.5
    assert judged["attribution"]["shaping_only"] is False


def test_shadow_and_canary_record_attribution_without_blocking(scene: Scene) -> None:
    # Stand-in verdicts recorded without terms: each reward reads as unnamed outcome reward.
    world = scene.world
    served = scene.episodes(world.baseline, "production", [False] * 6)
    write_episodes(scene.execution, [
        {"id": f"{e}:shadow", "batch_id": e.rsplit(":", 2)[0], "task_id": world.task_ids[0],
         "checkpoint_id": world.candidate, "purpose": "shadow", "group_id": e,
         "success": True, "outcome": {"shadow_of": e}} for e in served],
        verifier=scene.verifier)
    scene.activities.decide_shadow(ShadowInput(
        promotion_id=scene.promotion_id, threshold_id=world.threshold_id,
        candidate_checkpoint_id=world.candidate, production_checkpoint_id=world.baseline,
        since=scene.since.isoformat()))
    _, _, shadow = scene.gate_row("shadow")
    assert shadow["attribution"]["baseline"] == "production"
    assert shadow["attribution"]["episodes"] == {"candidate": 6, "production": 6}
    assert shadow["attribution"]["task_delta"] == 1.0
    assert shadow["attribution"]["success_rate_delta"] == 1.0

    scene.episodes(world.candidate, "canary", [True] * 4 + [False] * 8)
    look_canary(scene, soak_complete=True)
    passed, reasons, canary = scene.gate_row("canary")
    assert canary["attribution"]["episodes"] == {"candidate": 12, "production": 6}
    assert {r["term"]: r["kind"] for r in canary["attribution"]["terms"]} == {
        "success": "task", "outcome": "shaping"}
    assert canary["attribution"]["violations"] == []
    assert not any("task term" in r for r in reasons)  # recorded, never a reason
