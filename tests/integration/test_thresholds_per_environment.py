"""Thresholds name eval sets per environment; a candidate is judged on what it trained on.

Two environments (A and B), each with its own frozen eval set. A threshold maps each
environment to its sets; a run trained on A is judged on A's set alone, a run trained on
both on both, and must pass each: good on A and bad on B fails, naming B's set. An
environment the threshold does not cover (and no default) is a problem naming it, never a
silent judgement on another environment's set. Real PostgreSQL and OPA; the evidence
activities are governance's own.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import Engine, text

from governance_loop.activities.evidence import EvidenceActivities
from governance_loop.activities.promotion import PromotionActivities
from governance_loop.contracts import OfflineEvalInput, PromotionPlan
from governance_loop.durations import PromotionTiming
from governance_loop.evalsets import (
    EvalSetError,
    candidate_eval_sets,
    create_eval_set,
    set_threshold,
)
from tests.factories import insert, make_checkpoint, uid
from tests.factories_governance import TEST_SPEC, write_episodes
from triloop.config import Settings
from triloop.db import session_scope
from triloop.models import Threshold
from triloop.wiring import build_authorizer

pytestmark = pytest.mark.integration


def _environment(owner: Engine, name: str) -> str:
    insert(owner, "environment", name=name, description="", created_by="test")
    version_id = uid("sha-")
    insert(owner, "environment_version", id=version_id, environment_name=name, version=1,
           contract={"task": name}, contract_text="task: x", fixture_hashes={},
           created_by="test")
    return version_id


def _tasks(owner: Engine, version_id: str, seeds: list[int]) -> list[str]:
    ids = []
    for seed in seeds:
        task_id = uid("task-")
        insert(owner, "task", id=task_id, environment_version_id=version_id, seed=seed,
               status="admitted", evidence={})
        ids.append(task_id)
    return ids


class World:
    """Environments A and B: a training task and a frozen two-task eval set each."""

    def __init__(self, settings: Settings, owner: Engine, gov: Engine) -> None:
        self.owner, self.gov = owner, gov
        self.authorizer = build_authorizer(settings, "governance")
        self.env_a, self.env_b = uid("env-a-"), uid("env-b-")
        self.version_a = _environment(owner, self.env_a)
        self.version_b = _environment(owner, self.env_b)
        [self.train_a] = _tasks(owner, self.version_a, [1])
        [self.train_b] = _tasks(owner, self.version_b, [1])
        self.eval_a = _tasks(owner, self.version_a, [2, 3])
        self.eval_b = _tasks(owner, self.version_b, [2, 3])
        self.name_a, self.name_b = uid("es-a-"), uid("es-b-")
        self.set_a = create_eval_set(engine=gov, authorizer=self.authorizer, name=self.name_a,
                                     task_ids=self.eval_a, requested_by="gov-admin").id
        self.set_b = create_eval_set(engine=gov, authorizer=self.authorizer, name=self.name_b,
                                     task_ids=self.eval_b, requested_by="gov-admin").id

    def run(self, task_ids: list[str]) -> str:
        run_id = uid("run-")
        insert(self.owner, "training_run", id=run_id, submitted_by="alice", name="t",
               config={"rollout": {"task_ids": task_ids}}, status="submitted",
               iterations_done=0)
        return run_id

    def threshold(self, eval_sets: dict[str, list[str]] | None, default: str | None = None,
                  name: str | None = None) -> Threshold:
        stored = set_threshold(engine=self.gov, authorizer=self.authorizer,
                               name=name or uid("thr-"), spec=TEST_SPEC, eval_set=default,
                               eval_sets=eval_sets, requested_by="gov-admin")
        with session_scope(self.owner) as session:
            row = session.get(Threshold, stored.id)
            assert row is not None
            session.expunge(row)
            return row


@pytest.fixture
def world(settings: Settings, owner_engine: Engine, role_engine: Any) -> World:
    return World(settings, owner_engine, role_engine("governance"))


def _chosen(world: World, threshold: Threshold, run_id: str) -> Any:
    with session_scope(world.owner) as session:
        return candidate_eval_sets(session=session, threshold=threshold, run_id=run_id)


def test_a_candidate_is_judged_on_the_eval_sets_of_the_environments_it_trained_on(
    world: World,
) -> None:
    both = world.threshold({world.env_a: [world.set_a], world.env_b: [world.set_b]})
    assert both.eval_sets == {world.env_a: [world.set_a], world.env_b: [world.set_b]}
    only_a = _chosen(world, both, world.run([world.train_a]))
    assert (only_a.eval_set_ids, only_a.problem) == ([world.set_a], None)
    two = _chosen(world, both, world.run([world.train_a, world.train_b]))
    assert set(two.eval_set_ids) == {world.set_a, world.set_b} and two.problem is None
    assert two.by_environment == {world.env_a: [world.set_a], world.env_b: [world.set_b]}

    # A version id names one version's sets; it wins over the environment's name.
    by_version = world.threshold({world.version_b: [world.set_b], world.env_a: [world.set_a]})
    assert _chosen(world, by_version, world.run([world.train_b])).eval_set_ids == [world.set_b]

    # Uncovered, no default: a problem naming the environment, not another's set.
    a_alone = world.threshold({world.env_a: [world.set_a]})
    missing = _chosen(world, a_alone, world.run([world.train_a, world.train_b]))
    assert missing.problem is not None and world.env_b in missing.problem
    assert f"version {world.version_b}" in missing.problem
    # With a default, the uncovered environment is judged on the default.
    with_default = world.threshold({world.env_a: [world.set_a]}, default=world.set_b)
    judged = _chosen(world, with_default, world.run([world.train_a, world.train_b]))
    assert judged.by_environment == {world.env_a: [world.set_a], world.env_b: [world.set_b]}


def test_a_threshold_naming_another_environments_set_or_nothing_is_refused(
    world: World,
) -> None:
    with pytest.raises(EvalSetError, match=f"holds task .* of {world.env_b} .*not of "
                                           f"'{world.env_a}'"):
        world.threshold({world.env_a: [world.set_b]})
    with pytest.raises(EvalSetError, match="no environment or environment version 'no-such-env'"):
        world.threshold({"no-such-env": [world.set_a]})
    with pytest.raises(EvalSetError, match="names a default eval set, or eval sets per"):
        world.threshold(None)
    with pytest.raises(EvalSetError, match="no frozen eval set 'no-such-set'"):
        world.threshold({world.env_a: ["no-such-set"]})
    with world.owner.connect() as conn:  # the database refuses a threshold naming no set
        with pytest.raises(Exception, match="threshold_names_an_eval_set"):
            conn.execute(text("INSERT INTO threshold (id, name, version, spec, created_by) "
                              "VALUES ('x', 'x', 1, '{}', 'x')"))


def _promotion(world: World, run_id: str, name: str) -> tuple[str, str, str]:
    baseline = make_checkpoint(world.owner)
    candidate = make_checkpoint(world.owner, parent_id=baseline)
    proposal_id, promotion_id = uid("prop-"), uid("promo-")
    insert(world.owner, "proposal", id=proposal_id, checkpoint_id=candidate, run_id=run_id,
           submitted_by="alice", evidence={})
    insert(world.owner, "promotion", id=promotion_id, proposal_id=proposal_id,
           checkpoint_id=candidate, run_id=run_id, submitted_by="alice", status="open",
           baseline_checkpoint_id=baseline)
    return promotion_id, candidate, baseline


def _batch(gov: Engine, execution: Engine, verifier: Engine, checkpoint: str,
           successes: dict[str, list[bool]]) -> str:
    """A batch governance requested, with these verdicts per task."""
    batch_id = uid("eval-")
    rows, plan = [], {}
    for k, (task_id, results) in enumerate(successes.items()):
        for i, ok in enumerate(results):
            episode = f"{batch_id}:{k}:{i}"
            plan[episode] = {"task_id": task_id, "seed": 0}
            rows.append({"id": episode, "batch_id": batch_id, "task_id": task_id,
                         "checkpoint_id": checkpoint, "purpose": "eval",
                         "group_id": f"{batch_id}:{k}", "success": ok})
    with gov.begin() as conn:
        conn.execute(text(
            "INSERT INTO rollout_batch (id, purpose, checkpoint_id, requested_by, "
            "planned_episodes) VALUES (:b, 'eval', :c, 'governance', CAST(:plan AS jsonb))"),
            {"b": batch_id, "c": checkpoint, "plan": json.dumps(plan)})
    write_episodes(execution, rows, verifier=verifier)
    return batch_id


def test_a_candidate_trained_on_two_environments_must_pass_both_eval_sets(
    world: World, settings: Settings, role_engine: Any,
) -> None:
    name = uid("thr-")
    world.threshold({world.env_a: [world.set_a], world.env_b: [world.set_b]}, name=name)
    run_id = world.run([world.train_a, world.train_b])
    promotion_id, candidate, baseline = _promotion(world, run_id, name)
    plan = PromotionPlan(promotion_id=promotion_id, submitted_by="alice",
                         candidate_checkpoint_id=candidate, baseline_checkpoint_id=baseline,
                         opened_at="", timing=PromotionTiming.for_profile("test"))
    promotions = PromotionActivities(world.gov, world.authorizer, threshold_name=name,
                                     timing=PromotionTiming.for_profile("test"))
    with session_scope(world.gov) as session:
        promotions._plan_evaluation(session, plan)
    assert plan.problem is None and set(plan.eval_set_ids) == {world.set_a, world.set_b}
    # One eval batch plays both sets' tasks: min_samples 8 over 2 tasks each, 4 per task.
    assert sorted((i.task_id, i.group_size) for i in plan.eval_items) == sorted(
        (t, 4) for t in world.eval_a + world.eval_b)

    execution, verifier = role_engine("execution"), role_engine("verifier")
    good_on_a = {t: [True] * 4 for t in world.eval_a} | {t: [False] * 4 for t in world.eval_b}
    so_so = {t: [True, False, False, False] for t in world.eval_a + world.eval_b}
    evidence = EvidenceActivities(world.gov, world.authorizer, verdict_wait_s=5.0)
    outcome = evidence.decide_offline_eval(OfflineEvalInput(
        promotion_id=promotion_id, threshold_id=plan.threshold_id or "",
        eval_set_id=plan.eval_set_id or "", eval_set_ids=plan.eval_set_ids,
        candidate_batch_id=_batch(world.gov, execution, verifier, candidate, good_on_a),
        production_batch_id=_batch(world.gov, execution, verifier, baseline, so_so)))
    assert not outcome.passed
    with world.owner.connect() as conn:
        reasons, stored = conn.execute(text(
            "SELECT reasons, evidence FROM gate_result WHERE promotion_id = :p"
            " AND gate = 'offline_eval'"), {"p": promotion_id}).one()
    by_name = {e["eval_set"]: e for e in stored["eval_sets"]}
    a_name, b_name = f"{world.name_a}@v1", f"{world.name_b}@v1"
    assert set(by_name) == {a_name, b_name}  # both judged, each on its own tasks' episodes
    assert by_name[a_name]["violations"] == []
    assert by_name[a_name]["candidate"]["episodes"] == 8
    assert by_name[b_name]["candidate"]["successes"] == 0
    assert reasons and all(b_name in r for r in reasons)
    assert stored["judged_for"] == {world.env_a: [world.set_a], world.env_b: [world.set_b]}


def test_a_candidate_on_an_environment_the_threshold_does_not_cover_is_not_evaluated(
    world: World,
) -> None:
    name = uid("thr-")
    world.threshold({world.env_a: [world.set_a]}, name=name)
    run_id = world.run([world.train_b])
    promotion_id, candidate, baseline = _promotion(world, run_id, name)
    plan = PromotionPlan(promotion_id=promotion_id, submitted_by="alice",
                         candidate_checkpoint_id=candidate, baseline_checkpoint_id=baseline,
                         opened_at="", timing=PromotionTiming.for_profile("test"))
    with session_scope(world.gov) as session:
        PromotionActivities(world.gov, world.authorizer, threshold_name=name,
                            timing=PromotionTiming.for_profile("test"))._plan_evaluation(
                                session, plan)
    assert plan.problem is not None and world.env_b in plan.problem
    assert plan.eval_items == [] and plan.eval_set_ids == []


def test_a_candidate_good_on_both_environments_passes_on_both_sets(
    world: World, role_engine: Any,
) -> None:
    name = uid("thr-")
    threshold = world.threshold({world.env_a: [world.set_a], world.env_b: [world.set_b]},
                                name=name)
    promotion_id, candidate, baseline = _promotion(
        world, world.run([world.train_a, world.train_b]), name)
    execution, verifier = role_engine("execution"), role_engine("verifier")
    tasks = world.eval_a + world.eval_b
    evidence = EvidenceActivities(world.gov, world.authorizer, verdict_wait_s=5.0)
    outcome = evidence.decide_offline_eval(OfflineEvalInput(
        promotion_id=promotion_id, threshold_id=threshold.id, eval_set_id=world.set_a,
        eval_set_ids=[world.set_a, world.set_b],
        candidate_batch_id=_batch(world.gov, execution, verifier, candidate,
                                  {t: [True] * 4 for t in tasks}),
        production_batch_id=_batch(world.gov, execution, verifier, baseline,
                                   {t: [True, True, False, False] for t in tasks})))
    assert outcome.passed, outcome.reasons
    assert outcome.reasons == [f"all 2 eval sets meet thresholds {name}@v1"]
