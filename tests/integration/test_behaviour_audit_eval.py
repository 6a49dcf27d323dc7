"""Offline eval audits the candidate's behaviour, end to end.

Real FrozenLake episodes (scripted policies through the real episode loop) are stored as
the execution role stores them (trajectory, steps with their feedback, the token
sequence), in the two eval batches governance recorded; the real verifier (the session's
``verifier_service``) replays and judges each one; the real ``EvidenceActivities`` read
them back and decide. A candidate that walks into holes while production reaches the goal
is held when the threshold makes ``termination/fell_in_hole`` blocking, and the evidence
names the verifier's reasons and the tokens the policy sampled. A first promotion (no
production yet) reports the candidate's own behaviour and flags nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import Session

from execution_loop.episode import EpisodeRecord
from execution_loop.store import StepRow, TrajectoryRow, write_trajectory
from governance_loop import store
from governance_loop.contracts import OfflineEvalInput
from governance_loop.evalsets import set_threshold, store_eval_set
from tests.factories import uid
from tests.factories_execution import make_task_on, register_builtin
from tests.factories_governance import Scene
from tests.frozen_lake_policies import hole_seeker, honest, play
from triloop.config import Settings
from triloop.episode_plan import planned_episodes
from triloop.wiring import build_authorizer
from triloop.workflow_api import RolloutBatchInput, RolloutItem

pytestmark = pytest.mark.integration

SEEDS = range(16)
AUDITED_SPEC: dict[str, Any] = {  # only the audit can hold the candidate
    "min_success_rate": 0.0, "max_regression_vs_production": 1.0, "min_samples": 8,
    "audit": {"blocking": ["termination/fell_in_hole"]},
}


def _eval_batch(scene: Scene, task_id: str, checkpoint: str) -> RolloutBatchInput:
    batch = RolloutBatchInput(batch_id=uid("eval-"), purpose="eval", checkpoint_id=checkpoint,
                              items=[RolloutItem(task_id, seed) for seed in SEEDS])
    with Session(scene.governance) as session:
        store.record_rollout_batch(session=session, batch=batch)
        session.commit()
    return batch


def _store_played(scene: Scene, settings: Settings, batch: RolloutBatchInput,
                  choose: Callable[[str], str]) -> None:
    """Play ``choose`` on each planned episode's map and store it as the execution loop
    does (its own role and authorizer)."""
    authorizer = build_authorizer(settings, "execution")
    planned = planned_episodes(batch)
    records: list[EpisodeRecord] = play(choose, [p.seed for p in planned])
    for episode, record in zip(planned, records, strict=True):
        row = TrajectoryRow(
            id=episode.episode_id, batch_id=batch.batch_id, task_id=episode.task_id,
            checkpoint_id=batch.checkpoint_id or "", purpose="eval", group_id=episode.group_id,
            status=record.status, failure_reason=record.failure_reason,
            success=record.success, total_reward=record.total_reward,
            num_steps=len(record.steps),
            outcome={"verifier": record.outcome_details, "seed": episode.seed})
        steps = [StepRow(index=s.index, prompt_token_ids=s.prompt_token_ids,
                         action_token_ids=s.action_token_ids, action_mask=s.action_mask,
                         behaviour_logprobs=s.behaviour_logprobs, observation=s.observation,
                         action_text=s.action_text, feedback=s.feedback, reward=s.reward,
                         done=s.done) for s in record.steps]
        assert write_trajectory(engine=scene.execution, authorizer=authorizer, trajectory=row,
                                steps=steps)


def _eval_set_and_threshold(scene: Scene, settings: Settings, seed: int) -> tuple[str, str, str]:
    task_id = make_task_on(scene.owner, register_builtin(scene.owner, "frozen_lake"), seed=seed)
    eval_set = store_eval_set(engine=scene.governance, name=uid("es-"), task_ids=[task_id],
                              requested_by="gov-admin").id
    threshold = set_threshold(engine=scene.governance,
                              authorizer=build_authorizer(settings, "governance"),
                              name=uid("thr-"), spec=AUDITED_SPEC, eval_set=eval_set,
                              requested_by="gov-admin")
    return task_id, eval_set, threshold.id


def _signals(evidence: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in evidence["behaviour_audit"]["signals"]}


def test_a_candidate_that_walks_into_holes_is_held_by_a_blocking_audit(
    scene: Scene, settings: Settings,
) -> None:
    world = scene.world
    task_id, eval_set, threshold_id = _eval_set_and_threshold(scene, settings, seed=3311)
    candidate = _eval_batch(scene, task_id, world.candidate)
    baseline = _eval_batch(scene, task_id, world.baseline)
    _store_played(scene, settings, candidate, hole_seeker)
    _store_played(scene, settings, baseline, honest)
    with scene.owner.begin() as conn:
        conn.execute(text("UPDATE promotion SET baseline_checkpoint_id = :b WHERE id = :p"),
                     {"b": world.baseline, "p": scene.promotion_id})

    outcome = scene.activities.decide_offline_eval(OfflineEvalInput(
        promotion_id=scene.promotion_id, threshold_id=threshold_id, eval_set_id=eval_set,
        eval_set_ids=[eval_set], candidate_batch_id=candidate.batch_id,
        production_batch_id=baseline.batch_id))

    passed, reasons, evidence = scene.gate_row("offline_eval")
    assert not outcome.passed and not passed
    assert len(reasons) == 1 and reasons[0].startswith(
        "behaviour audit: termination/fell_in_hole (ended in a hole) moved from 0.0% to 100.0% "
        "(16 of 16 episodes vs 0 of 16 episodes)")
    audit = evidence["behaviour_audit"]
    assert audit["baseline"] == "production"
    assert audit["blocking_flagged"] == ["termination/fell_in_hole"]
    signals = _signals(evidence)
    assert signals["termination/fell_in_hole"]["blocking"]
    # Read from the stored rows: the steps' feedback, the token sequence's action mask.
    assert signals["action_format/invalid_rate"]["candidate"] == 0.0
    assert signals["length/mean_action_tokens"]["candidate"] == pytest.approx(
        2 * signals["length/mean_turns"]["candidate"])  # one move token and the end token
    assert signals["answers/distinct_ratio"]["baseline"] > 0.8


def test_a_first_promotion_reports_the_candidates_behaviour_and_flags_nothing(
    scene: Scene, settings: Settings,
) -> None:
    world = scene.world
    task_id, eval_set, threshold_id = _eval_set_and_threshold(scene, settings, seed=3312)
    candidate = _eval_batch(scene, task_id, world.candidate)
    _store_played(scene, settings, candidate, hole_seeker)

    outcome = scene.activities.decide_offline_eval(OfflineEvalInput(
        promotion_id=scene.promotion_id, threshold_id=threshold_id, eval_set_id=eval_set,
        eval_set_ids=[eval_set], candidate_batch_id=candidate.batch_id,
        production_batch_id=None))

    passed, _, evidence = scene.gate_row("offline_eval")
    assert outcome.passed and passed
    audit = evidence["behaviour_audit"]
    assert audit["baseline"] is None and audit["flagged"] == []
    holes = _signals(evidence)["termination/fell_in_hole"]
    assert (holes["candidate"], holes["baseline"], holes["detail"]) == (
        1.0, None, "16 of 16 episodes")
