"""The reward placebo control's pure parts: the return without its task term, the run's
placebo config, the threshold's placebo spec, and the offline-eval decision against it."""

from __future__ import annotations

from typing import Any

import pytest

from governance_loop.gates import (
    EpisodeStats,
    EvalSetResult,
    PlaceboArm,
    PlaceboSpec,
    ThresholdSpec,
    ThresholdSpecError,
    check_placebo,
    decide_offline_eval,
)
from learning_loop.batch import build_training_samples
from learning_loop.trajectory_reader import (
    StoredStep,
    StoredTrajectory,
    outcome_reward_terms,
    task_reward,
    to_rollout_data,
)
from learning_loop.workflows import placebo_completion
from triloop.placebo import is_placebo_of, placebo_config, placebo_name
from triloop.run_config import AdvantageConfig, RunConfigError


def step(index: int, reward: float) -> StoredStep:
    return StoredStep(index, [1, 2, 3], [7, 7], [0, 0, 0, 1, 1], [-0.5, -0.5], reward)


def lake(tid: str, total: float, *, success: bool, terms: dict[str, float] | None = None
         ) -> StoredTrajectory:
    """Two moves worth 0.01 each (process reward), the rest is the outcome's."""
    return StoredTrajectory(tid, "g", "task-a", 1, total, [step(0, 0.01), step(1, 0.01)],
                            success=success, outcome_terms=terms)


# --- the return a placebo run trains on ----------------------------------------------------

def test_a_named_success_term_is_removed_and_shaping_stays() -> None:
    won = lake("won", 1.32, success=True, terms={"success": 1.0, "progress": 0.3})
    lost = lake("lost", -0.48, success=False, terms={"failure": -0.8, "progress": 0.3})
    normal = to_rollout_data([won, lost])
    placebo = to_rollout_data([won, lost], zero_task_reward=True)

    assert [r.total_reward for r in normal.returns] == pytest.approx([1.32, -0.48])
    assert [r.total_reward for r in placebo.returns] == pytest.approx([0.32, -0.48])
    # The success flag is the verdict, reported as it was: only the reward changes.
    assert [r.success for r in placebo.returns] == [True, False]
    # The outcome record carries the change; the step rewards are the environment's.
    assert [s.reward for s in placebo.steps] == pytest.approx(
        [0.01, 0.01, 0.3, 0.01, 0.01, -0.5])


def test_an_unsplit_outcome_is_removed_from_successes_only() -> None:
    won, lost = lake("won", 1.02, success=True), lake("lost", 0.02, success=False)
    assert task_reward(won, 0.02) == pytest.approx(1.0)
    assert task_reward(lost, 0.02) == 0.0
    placebo = to_rollout_data([won, lost], zero_task_reward=True)
    assert [r.total_reward for r in placebo.returns] == pytest.approx([0.02, 0.02])


def test_a_placebo_group_of_equal_shaping_has_no_advantage_where_the_task_had_one() -> None:
    # Success alone told these episodes apart: with it removed nothing is left to learn.
    group = [lake("won", 1.02, success=True), lake("lost", 0.02, success=False)]
    _, normal = build_training_samples(to_rollout_data(group).steps, AdvantageConfig())
    _, placebo = build_training_samples(
        to_rollout_data(group, zero_task_reward=True).steps, AdvantageConfig())
    assert normal.advantages["won"] > 0 > normal.advantages["lost"]
    assert placebo.advantages == {"won": 0.0, "lost": 0.0}


@pytest.mark.parametrize(("outcome", "expected"), [
    ({"verifier": {"reward_terms": {"success": 1, "progress": 0.25}}},
     {"success": 1.0, "progress": 0.25}),
    ({"verifier": {"reached_goal": True}}, None),
    ({}, None),
    ({"verifier": {"reward_terms": {"success": "1"}}}, None),
    ({"verifier": {"reward_terms": {"success": True}}}, None),
    ({"verifier": {"reward_terms": ["success"]}}, None),
    ({"verifier": "text"}, None),
])
def test_outcome_terms_are_read_only_in_their_documented_shape(
    outcome: dict[str, Any], expected: dict[str, float] | None,
) -> None:
    assert outcome_reward_terms(outcome) == expected


def test_a_placebo_run_says_its_last_checkpoint_is_the_placebo() -> None:
    reason = placebo_completion("4 iterations", "ckpt-9")
    assert reason.startswith("4 iterations; placebo run")
    assert "last checkpoint ckpt-9 is the placebo, never proposed" in reason


# --- the placebo of a run config -------------------------------------------------------------

RUN: dict[str, Any] = {
    "name": "lake run", "model": {"base": "ckpt-base"},
    "rollout": {"task_ids": ["t1", "t2"], "group_size": 4},
    "schedule": {"iterations": 4, "propose_every": 2, "seed": 7},
}


def test_the_placebo_config_keeps_every_setting_and_the_seed() -> None:
    placebo = placebo_config(RUN)
    assert placebo["name"] == "lake run (placebo)"
    assert placebo["advantage"]["zero_task_reward"] is True
    assert placebo["schedule"]["seed"] == 7
    assert placebo["rollout"]["task_ids"] == ["t1", "t2"]
    assert is_placebo_of(RUN, placebo)
    assert not is_placebo_of(placebo, RUN)  # the run is no placebo of its placebo
    assert len(placebo_name("x" * 200)) == 200


@pytest.mark.parametrize("change", [
    {"schedule": {**RUN["schedule"], "seed": 8}},
    {"rollout": {**RUN["rollout"], "task_ids": ["t1"]}},
    {"model": {"base": "ckpt-other"}},
])
def test_a_run_of_another_config_is_no_placebo(change: dict[str, Any]) -> None:
    assert not is_placebo_of(RUN, placebo_config({**RUN, **change}))


def test_an_invalid_stored_config_has_no_placebo() -> None:
    with pytest.raises(RunConfigError):
        placebo_config({"name": "empty"})
    assert not is_placebo_of({}, placebo_config(RUN))


# --- the threshold's placebo spec --------------------------------------------------------------

def spec(**placebo: Any) -> ThresholdSpec:
    return ThresholdSpec.from_mapping({
        "version": "V", "min_success_rate": 0.0, "max_regression_vs_production": 1.0,
        "min_samples": 8, "placebo": placebo})


def test_the_placebo_is_off_by_default_and_required_per_alias() -> None:
    assert not ThresholdSpec("V", 0.0, 1.0, 8).placebo.required_for("production")
    assert spec(required=True).placebo.required_for("canary")
    chosen = spec(required_for_aliases=["production"]).placebo
    assert chosen.required_for("production") and not chosen.required_for("staging")
    assert chosen == PlaceboSpec(required_for_aliases=("production",))
    round_trip = ThresholdSpec.from_mapping(spec(margin=0.1).to_dict())
    assert round_trip.placebo.margin == 0.1


@pytest.mark.parametrize(("placebo", "message"), [
    ({"margin": 1.5}, "placebo.margin must be a fraction in [0, 1]"),
    ({"margin": -0.1}, "placebo.margin must be a fraction in [0, 1]"),
    ({"margin": "5%"}, "placebo.margin must be a fraction in [0, 1]"),
    ({"margin": None}, "placebo.margin must be a fraction in [0, 1]"),
    ({"required": "yes"}, "placebo.required must be true or false"),
    ({"required_for_aliases": "production"}, "placebo.required_for_aliases must be a list"),
    ({"required_for_aliases": [""]}, "placebo.required_for_aliases must be a list"),
    ({"margins": 0.1}, "placebo: unknown fields ['margins']"),
])
def test_a_bad_placebo_spec_is_refused_clearly(placebo: dict[str, Any], message: str) -> None:
    with pytest.raises(ThresholdSpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        spec(**placebo)


# --- the offline-eval decision against the placebo ----------------------------------------------

def stats(n: int, successes: int) -> EpisodeStats:
    return EpisodeStats(n, successes, 0.5, 0.1)


def arm(placebo: dict[str, EpisodeStats] | None) -> PlaceboArm:
    if placebo is None:
        return PlaceboArm(candidate_run_id="run-1", alias="production")
    return PlaceboArm(candidate_run_id="run-1", alias="production", run_id="run-p",
                      checkpoint_id="ckpt-p", eval_sets=placebo)


def test_the_candidate_beats_the_placebo_by_the_margin_on_every_set() -> None:
    thresholds = spec(required=True, margin=0.05)
    # 20 of 40 against 18 of 40 is exactly 5 points: equal to the margin passes.
    check = check_placebo({"a@v1": stats(40, 20), "b@v1": stats(40, 30)},
                          arm({"a@v1": stats(40, 18), "b@v1": stats(40, 10)}), thresholds)
    assert check.reasons == []
    assert [s["met"] for s in check.evidence["eval_sets"]] == [True, True]
    assert check.evidence["run_id"] == "run-p" and check.evidence["checkpoint_id"] == "ckpt-p"


def test_a_gain_the_placebo_also_makes_fails_naming_the_set() -> None:
    check = check_placebo({"a@v1": stats(40, 20), "b@v1": stats(40, 30)},
                          arm({"a@v1": stats(40, 19), "b@v1": stats(40, 10)}),
                          spec(required=True, margin=0.05))
    (reason,) = check.reasons
    assert reason.startswith("placebo: eval set 'a@v1': candidate success rate 50.0% against"
                             " the placebo's 47.5%: a gap of 2.5 points, the margin is 5.0"
                             " points")
    assert "placebo run run-p, checkpoint ckpt-p; thresholds V" in reason
    assert [s["met"] for s in check.evidence["eval_sets"]] == [False, True]


def test_a_placebo_short_of_episodes_fails() -> None:
    check = check_placebo({"a@v1": stats(40, 40)}, arm({}), spec(required=True))
    assert check.reasons == ["placebo: eval set 'a@v1': the placebo has 0 episodes, min_samples"
                             " is 8 (placebo run run-p, checkpoint ckpt-p; thresholds V)"]


def test_no_placebo_run_fails_naming_the_command_that_makes_one() -> None:
    decision = decide_offline_eval(
        [EvalSetResult("a@v1", "h", stats(40, 40), stats(40, 10))],
        spec(required_for_aliases=["production"]), placebo=arm(None))
    assert not decision.passed
    (reason,) = decision.reasons
    assert "`triloop train placebo run-1`" in reason
    assert decision.evidence["placebo"]["run_id"] is None
    assert decision.evidence["placebo"]["command"] == "`triloop train placebo run-1`"


def test_offline_eval_without_a_placebo_arm_records_none() -> None:
    decision = decide_offline_eval(
        [EvalSetResult("a@v1", "h", stats(40, 40), stats(40, 10))], spec())
    assert decision.passed and "placebo" not in decision.evidence
