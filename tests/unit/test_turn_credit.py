"""Turn-level credit (outcome, discounted, turn_grpo) and task/environment normalisation."""

from __future__ import annotations

import math

import pytest

from learning_loop.advantages import (
    TrajectoryReturn,
    TrajectoryTurns,
    compute_turn_advantages,
    mean_and_std,
    returns_to_go,
)
from learning_loop.batch import StepRecord, build_training_samples
from tests.factories import outcome_advantages
from triloop.run_config import AdvantageConfig, RunConfigError, run_config_from_data

EXACT = AdvantageConfig(eps=1e-12)


def turns(tid: str, group: str, *rewards: float, task: str = "t", env: str = "e"
          ) -> TrajectoryTurns:
    return TrajectoryTurns(tid, group, task, tuple(rewards), env)


def test_returns_to_go_by_hand() -> None:
    assert returns_to_go([1.0, 0.0, 2.0], 0.5) == pytest.approx((1.5, 1.0, 2.0))
    assert returns_to_go([1.0, 0.0, 2.0], 1.0) == (3.0, 2.0, 2.0)
    assert returns_to_go([], 0.9) == ()


def test_outcome_broadcasts_the_trajectory_advantage_to_every_turn() -> None:
    batch = [turns("a", "g", 0.5, 0.5), turns("b", "g", 0.0, 0.0, 0.0)]
    result = compute_turn_advantages(batch, EXACT)
    assert result.turn_advantages["a"] == pytest.approx((1.0, 1.0))
    assert result.turn_advantages["b"] == pytest.approx((-1.0, -1.0, -1.0))


def test_discounted_with_gamma_one_and_outcome_only_rewards_equals_outcome() -> None:
    batch = [turns("a", "g", 0.0, 0.0, 1.0), turns("b", "g", 0.0, 0.0), turns("c", "g", 1.0)]
    outcome = compute_turn_advantages(batch, EXACT)
    discounted = compute_turn_advantages(batch, EXACT.model_copy(update={"credit": "discounted"}))
    for tid, advantages in outcome.turn_advantages.items():
        assert discounted.turn_advantages[tid] == pytest.approx(advantages)


def test_discounted_credits_a_turn_only_with_what_came_after_it() -> None:
    # a: process reward 1 at turn 0, nothing after; b: nothing at all. gamma = 0.5.
    config = AdvantageConfig(credit="discounted", gamma=0.5, scale_by_group_std=False)
    result = compute_turn_advantages([turns("a", "g", 1.0, 0.0), turns("b", "g", 0.0, 0.0)],
                                     config)
    # G_a = (1, 0), G_b = (0, 0); baseline = mean of G_.0 = 0.5.
    assert result.turn_advantages["a"] == pytest.approx((0.5, -0.5))
    assert result.turn_advantages["b"] == pytest.approx((-0.5, -0.5))
    # outcome credit would give a's second turn +0.5 for a reward it came after
    outcome = compute_turn_advantages([turns("a", "g", 1.0, 0.0), turns("b", "g", 0.0, 0.0)],
                                      AdvantageConfig(scale_by_group_std=False))
    assert outcome.turn_advantages["a"] == pytest.approx((0.5, 0.5))


def test_discount_prefers_the_earlier_success() -> None:
    config = AdvantageConfig(credit="discounted", gamma=0.9, eps=1e-12)
    result = compute_turn_advantages([turns("fast", "g", 1.0), turns("slow", "g", 0.0, 1.0)],
                                     config)
    assert result.advantages["fast"] > 0 > result.advantages["slow"]


def test_turn_grpo_normalises_returns_to_go_over_every_turn_of_the_group() -> None:
    config = AdvantageConfig(credit="turn_grpo", gamma=1.0, eps=1e-12)
    result = compute_turn_advantages([turns("a", "g", 1.0, 1.0), turns("b", "g", 0.0, 1.0)],
                                     config)
    # G_a = (2, 1), G_b = (1, 1); pool (2, 1, 1, 1): mean 1.25, std sqrt(3)/4.
    mean, std = 1.25, math.sqrt(3) / 4
    assert result.turn_advantages["a"] == pytest.approx(((2 - mean) / std, (1 - mean) / std))
    assert result.turn_advantages["b"] == pytest.approx(((1 - mean) / std,) * 2)
    pooled = [*result.turn_advantages["a"], *result.turn_advantages["b"]]
    assert mean_and_std(pooled) == pytest.approx((0.0, 1.0))


def test_turn_credit_reaches_the_samples_turn_by_turn() -> None:
    def step(tid: str, reward: float, action: list[int]) -> StepRecord:
        return StepRecord(tid, "g", "t", 0, [1], action, [-0.1] * len(action), reward)

    steps = [step("a", 1.0, [5]), step("a", 0.0, [6]), step("a", 0.0, []),  # outcome 0
             step("b", 0.0, [7]), step("b", 0.0, [8]), step("b", 0.0, [])]
    config = AdvantageConfig(credit="discounted", gamma=0.5, scale_by_group_std=False)
    samples, _ = build_training_samples(steps, config)
    assert [s.advantage for s in samples] == pytest.approx([0.5, -0.5, -0.5, -0.5])


def test_task_normalisation_did_nothing_after_the_group_std_and_now_does() -> None:
    # One task, two groups with reward scales 1 and 3: group std scaling gives +-1 to both.
    batch = [TrajectoryReturn("a1", "g1", "t", 0.0), TrajectoryReturn("a2", "g1", "t", 2.0),
             TrajectoryReturn("b1", "g2", "t", 0.0), TrajectoryReturn("b2", "g2", "t", 6.0)]
    group_only = outcome_advantages(batch, EXACT).advantages
    assert group_only == pytest.approx({"a1": -1, "a2": 1, "b1": -1, "b2": 1})
    # The old rule (divide the group-scaled advantages again by their task std) is a no-op:
    _, old_task_std = mean_and_std(list(group_only.values()))
    assert old_task_std == pytest.approx(1.0)
    # The task std of centred returns (+-1, +-3) is sqrt(5): the groups keep their scale.
    with_task = outcome_advantages(batch, EXACT.model_copy(update={"task_normalization": True}))
    s = math.sqrt(5)
    assert with_task.advantages == pytest.approx({"a1": -1 / s, "a2": 1 / s,
                                                  "b1": -3 / s, "b2": 3 / s})


def test_task_normalisation_equalises_tasks_under_the_default_std_scaling() -> None:
    rows = [("a1", "ga", "big", 0.0), ("a2", "ga", "big", 10.0), ("a3", "ga2", "big", 0.0),
            ("a4", "ga2", "big", 20.0), ("b1", "gb", "small", 0.0), ("b2", "gb", "small", 1.0),
            ("b3", "gb2", "small", 0.0), ("b4", "gb2", "small", 2.0)]
    batch = [TrajectoryReturn(*row) for row in rows]
    adv = outcome_advantages(batch, EXACT.model_copy(update={"task_normalization": True}))
    # Both tasks have the same shape at scales 10 and 1: identical advantages.
    assert [adv.advantages[i] for i in ("a1", "a2", "a3", "a4")] == pytest.approx(
        [adv.advantages[i] for i in ("b1", "b2", "b3", "b4")])


def test_environment_normalisation_pools_the_tasks_of_one_environment() -> None:
    batch = [
        TrajectoryReturn("a1", "ga", "lake-1", 0.0, "lake"),
        TrajectoryReturn("a2", "ga", "lake-1", 1.0, "lake"),
        TrajectoryReturn("b1", "gb", "lake-2", 0.0, "lake"),
        TrajectoryReturn("b2", "gb", "lake-2", 3.0, "lake"),
        TrajectoryReturn("c1", "gc", "calc", 0.0, "arith"),
        TrajectoryReturn("c2", "gc", "calc", 100.0, "arith"),
    ]
    config = EXACT.model_copy(update={"environment_normalization": True})
    adv = outcome_advantages(batch, config).advantages
    lake_std = math.sqrt((0.25 + 0.25 + 2.25 + 2.25) / 4)
    assert adv["a2"] == pytest.approx(0.5 / lake_std)
    assert adv["b2"] == pytest.approx(1.5 / lake_std)
    assert adv["c2"] == pytest.approx(1.0)  # an environment of its own is scaled to +-1
    # It takes precedence over task normalisation (which would give +-1 per task).
    both = outcome_advantages(batch, config.model_copy(update={"task_normalization": True}))
    assert both.advantages == pytest.approx(adv)


def test_zero_variance_groups_are_listed_for_dynamic_sampling() -> None:
    batch = [turns("a", "solved", 1.0), turns("b", "solved", 1.0),
             turns("c", "mixed", 1.0), turns("d", "mixed", 0.0)]
    result = compute_turn_advantages(batch, EXACT)
    assert result.zero_variance_group_ids == {"solved"}
    assert result.turn_advantages["a"] == (0.0,)


@pytest.mark.parametrize(("section", "message"), [
    ({"credit": "sideways"}, "advantage.credit"),
    ({"gamma": 0.0}, "advantage.gamma"),
    ({"gamma": 1.5}, "advantage.gamma"),
])
def test_bad_credit_settings_are_refused(section: dict[str, object], message: str) -> None:
    data = {"name": "r", "model": {"base": "m"}, "rollout": {"task_ids": ["t"]},
            "advantage": section}
    with pytest.raises(RunConfigError) as caught:
        run_config_from_data(data)
    assert message in str(caught.value)
