"""Issue 32, route 5: offline eval counts the verifier's verdicts, not execution's rows.

End to end on the real FrozenLake environment and the real verifier process (the session's
``verifier_service``, as ``triloop_verifier``): governance records its two eval batches; as
the execution role (its own password) the candidate's rows claim 13 of 16 successes (0.81)
while the actions stored with them lose every game, and the baseline's rows are honest
winning games. The verifier replays each episode from the seed governance planned and the
stored actions: the candidate's verdicts are 0/16, the gate holds the candidate, and each
contradicted row is audited as an ``integrity_violation``. On main the gate read the rows'
own ``success`` and passed the candidate. The same holds for people's production traffic:
the canary gate counts the verifier's losses, not the rows' claimed wins.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlmodel import Session

from execution_loop.environments.frozen_lake import reference_solution
from execution_loop.environments.registry import get_environment
from governance_loop import store
from governance_loop.contracts import OfflineEvalInput
from governance_loop.evalsets import store_eval_set
from tests.factories import uid
from tests.factories_execution import make_task_on, register_builtin
from tests.factories_governance import Scene, look_canary
from triloop.episode_plan import planned_episodes
from triloop.workflow_api import RolloutBatchInput, RolloutItem
from verifier.replay import replay_and_judge
from web.actions import record_production_batch

pytestmark = pytest.mark.integration

SEEDS = range(16)


def _eval_batch(scene: Scene, task_id: str, checkpoint: str) -> RolloutBatchInput:
    batch = RolloutBatchInput(batch_id=uid("eval-"), purpose="eval", checkpoint_id=checkpoint,
                              items=[RolloutItem(task_id, seed) for seed in SEEDS])
    with Session(scene.governance) as session:
        store.record_rollout_batch(session=session, batch=batch)
        session.commit()
    return batch


def _store(engine: Engine, batch: RolloutBatchInput, episode_id: str, *, actions: list[str],
           success: bool, total_reward: float, checkpoint: str | None = None,
           purpose: str = "eval") -> None:
    """One episode as the execution role writes it, with whatever it claims."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO trajectory (id, batch_id, task_id, checkpoint_id, purpose, group_id, "
            "sample_index, policy_version, status, success, total_reward, num_steps) VALUES "
            "(:i, :b, :t, :c, :p, :i, 0, 0, 'completed', :s, :r, :n)"),
            {"i": episode_id, "b": batch.batch_id, "t": batch.items[0].task_id,
             "c": checkpoint or batch.checkpoint_id, "p": purpose, "s": success,
             "r": total_reward, "n": len(actions)})
        for index, action in enumerate(actions):
            conn.execute(text(
                "INSERT INTO step (trajectory_id, index, observation, action_text, reward, done)"
                " VALUES (:i, :x, '', :a, 0, :d)"),
                {"i": episode_id, "x": index, "a": action, "d": index == len(actions) - 1})


def _integrity_events(owner: Engine, batch_id: str) -> dict[str, Any]:
    with owner.connect() as conn:
        rows = conn.execute(text(
            "SELECT resource->>'id', payload FROM audit_event WHERE action = "
            "'integrity_violation' AND payload->>'batch_id' = :b"), {"b": batch_id}).all()
    return {str(r[0]): r[1] for r in rows}


def test_offline_eval_holds_a_candidate_whose_rows_claim_wins_it_never_played(
    scene: Scene,
) -> None:
    world = scene.world
    version = register_builtin(scene.owner, "frozen_lake")
    task_id = make_task_on(scene.owner, version, seed=3207)
    # Each eval set is judged on its own tasks' episodes: the batches play this set's task.
    judged_on = store_eval_set(engine=scene.governance, name=uid("es-"), task_ids=[task_id],
                               requested_by="gov-admin").id
    candidate = _eval_batch(scene, task_id, world.candidate)
    baseline = _eval_batch(scene, task_id, world.baseline)
    env = get_environment("frozen_lake")()
    claimed_wins = []
    for index, planned in enumerate(planned_episodes(candidate)):
        wins = index < 13  # 13 of 16 claimed won (0.81); every game stored is lost
        _store(scene.execution, candidate, planned.episode_id, actions=["act"],
               success=wins, total_reward=1.0 if wins else 0.0)
        if wins:
            claimed_wins.append(planned.episode_id)
    for planned in planned_episodes(baseline):  # honest rows: what the winning games earn
        moves = reference_solution(planned.seed, env.contract)
        honest = replay_and_judge(get_environment("frozen_lake")(), seed=planned.seed,
                                  actions=moves)
        assert honest.success
        _store(scene.execution, baseline, planned.episode_id, actions=moves, success=True,
               total_reward=honest.total_reward)
    with scene.owner.begin() as conn:
        conn.execute(text("UPDATE promotion SET baseline_checkpoint_id = :b WHERE id = :p"),
                     {"b": world.baseline, "p": scene.promotion_id})

    outcome = scene.activities.decide_offline_eval(OfflineEvalInput(
        promotion_id=scene.promotion_id, threshold_id=world.threshold_id,
        eval_set_id=judged_on, eval_set_ids=[judged_on], candidate_batch_id=candidate.batch_id,
        production_batch_id=baseline.batch_id))

    passed, reasons, evidence = scene.gate_row("offline_eval")
    assert not outcome.passed and not passed
    judged = evidence["eval_sets"][0]
    assert (judged["candidate"]["episodes"], judged["candidate"]["successes"]) == (16, 0)
    assert (judged["production"]["episodes"], judged["production"]["successes"]) == (16, 16)
    assert any("candidate success rate 0.0%" in r for r in reasons)
    assert evidence["batches_bound"]["judged_by"] == "triloop_verifier"
    # Every claimed win is a contradiction on record; the honest baseline raised none.
    contradicted = _integrity_events(scene.owner, candidate.batch_id)
    assert set(claimed_wins) <= set(contradicted)
    assert contradicted[claimed_wins[0]]["execution"]["success"] is True
    assert contradicted[claimed_wins[0]]["verifier"]["success"] is False
    assert _integrity_events(scene.owner, baseline.batch_id) == {}
    with scene.owner.connect() as conn:
        stamped = conn.execute(text("SELECT DISTINCT recorded_by FROM verdict WHERE batch_id = "
                                    "ANY(:b)"), {"b": [candidate.batch_id,
                                                       baseline.batch_id]}).scalars().all()
    assert stamped == ["triloop_verifier"]


def _judged(owner: Engine, episode_ids: list[str]) -> bool:
    with owner.connect() as conn:
        done = conn.execute(text("SELECT count(*) FROM verdict WHERE trajectory_id = ANY(:i)"),
                            {"i": episode_ids}).scalar_one()
    return int(done) == len(episode_ids)


def test_the_canary_counts_the_verifier_not_rows_claiming_wins_in_web_traffic(
    scene: Scene, role_engine: Any,
) -> None:
    world = scene.world
    task_id = make_task_on(scene.owner, register_builtin(scene.owner, "frozen_lake"), seed=3208)
    traffic = RolloutBatchInput(batch_id=uid("traffic-"), purpose="production",
                                items=[RolloutItem(task_id, seed) for seed in range(20)])
    with Session(role_engine("web")) as session:  # as the web service records people's batch
        record_production_batch(session=session, batch=traffic)
        session.commit()
    played = planned_episodes(traffic)
    env = get_environment("frozen_lake")()
    for index, planned in enumerate(played):
        if index < 10:  # the candidate's canary share: rows claim wins, the games are lost
            _store(scene.execution, traffic, planned.episode_id, actions=["act"], success=True,
                   total_reward=1.0, checkpoint=world.candidate, purpose="canary")
            continue
        moves = reference_solution(planned.seed, env.contract)
        honest = replay_and_judge(get_environment("frozen_lake")(), seed=planned.seed,
                                  actions=moves)
        _store(scene.execution, traffic, planned.episode_id, actions=moves, success=True,
               total_reward=honest.total_reward, checkpoint=world.baseline,
               purpose="production")
    ids = [p.episode_id for p in played]
    for _ in range(600):  # the verifier runs beside the test: wait until it judged all
        if _judged(scene.owner, ids):
            break
        time.sleep(0.1)
    assert _judged(scene.owner, ids)

    look_canary(scene, soak_complete=True)

    _, _, evidence = scene.gate_row("canary")
    assert evidence["canary"]["episodes"] == 10 and evidence["canary"]["successes"] == 0
    assert evidence["production"]["episodes"] == 10
    assert evidence["production"]["successes"] == 10
    assert len(_integrity_events(scene.owner, traffic.batch_id)) == 10
