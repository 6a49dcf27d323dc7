"""GRPO advantages: group and task normalisation, zero-variance groups, step broadcasting."""

from __future__ import annotations

import math

import pytest

from learning_loop.advantages import (
    AdvantageInputError,
    TrajectoryReturn,
    within_group_reward_variances,
)
from learning_loop.batch import StepRecord, build_training_samples
from learning_loop.batch_metrics import dynamic_sampling_series
from tests.factories import outcome_advantages
from triloop.run_config import AdvantageConfig

EXACT = AdvantageConfig(eps=1e-12)


def returns(*rows: tuple[str, str, str, float]) -> list[TrajectoryReturn]:
    return [TrajectoryReturn(*row) for row in rows]


def test_group_normalisation_by_hand() -> None:
    # mean 0.5, population std 0.5 -> +-1
    batch = returns(("a", "g", "t", 1.0), ("b", "g", "t", 0.0), ("c", "g", "t", 0.0),
                    ("d", "g", "t", 1.0))
    result = outcome_advantages(batch, EXACT)
    assert result.advantages == pytest.approx({"a": 1.0, "b": -1.0, "c": -1.0, "d": 1.0})
    assert (result.groups, result.zero_variance_groups) == (1, 0)


def test_group_normalisation_uneven_group() -> None:
    # rewards 3, 0, 0: mean 1, std sqrt(2) -> 2/sqrt2, -1/sqrt2, -1/sqrt2
    batch = returns(("a", "g", "t", 3.0), ("b", "g", "t", 0.0), ("c", "g", "t", 0.0))
    adv = outcome_advantages(batch, EXACT).advantages
    assert adv["a"] == pytest.approx(math.sqrt(2))
    assert adv["b"] == pytest.approx(-1 / math.sqrt(2))
    assert sum(adv.values()) == pytest.approx(0.0, abs=1e-12)


def test_skip_std_scaling_keeps_centred_rewards() -> None:
    batch = returns(("a", "g", "t", 1.0), ("b", "g", "t", 0.0))
    adv = outcome_advantages(batch, AdvantageConfig(scale_by_group_std=False)).advantages
    assert adv == {"a": 0.5, "b": -0.5}


def test_eps_keeps_tiny_variance_finite() -> None:
    batch = returns(("a", "g", "t", 1e-3), ("b", "g", "t", 0.0))
    adv = outcome_advantages(batch, AdvantageConfig(eps=1e-3)).advantages
    # std = 5e-4, so (5e-4) / (5e-4 + 1e-3) = 1/3
    assert adv["a"] == pytest.approx(1 / 3)


def test_zero_variance_groups_get_zero_and_are_counted() -> None:
    batch = returns(
        ("a", "solved", "t", 1.0), ("b", "solved", "t", 1.0),
        ("c", "single", "t", 0.7),
        ("d", "mixed", "t", 1.0), ("e", "mixed", "t", 0.0),
    )
    result = outcome_advantages(batch, EXACT)
    assert result.advantages["a"] == result.advantages["b"] == result.advantages["c"] == 0.0
    assert result.advantages["d"] == pytest.approx(1.0)
    assert (result.groups, result.zero_variance_groups) == (3, 2)
    # The share the iteration's metrics report (the learner's real use of these counts).
    share = dynamic_sampling_series(result.zero_variance_groups, result.groups)
    assert share["dynamic_sampling/drop_rate"] == pytest.approx(2 / 3)


def test_task_normalisation_equalises_reward_scales() -> None:
    batch = returns(
        ("a1", "ga", "big", 0.0), ("a2", "ga", "big", 10.0),
        ("b1", "gb", "small", 0.0), ("b2", "gb", "small", 1.0),
    )
    group_only = outcome_advantages(batch, AdvantageConfig(scale_by_group_std=False))
    assert group_only.advantages["a2"] == 5.0 and group_only.advantages["b2"] == 0.5
    config = AdvantageConfig(scale_by_group_std=False, task_normalization=True, eps=1e-12)
    adv = outcome_advantages(batch, config).advantages
    assert adv == pytest.approx({"a1": -1.0, "a2": 1.0, "b1": -1.0, "b2": 1.0})


def test_task_normalisation_leaves_out_zero_variance_groups() -> None:
    batch = returns(
        ("a1", "g1", "t", 0.0), ("a2", "g1", "t", 10.0),
        ("c1", "g2", "t", 3.0), ("c2", "g2", "t", 3.0),
    )
    config = AdvantageConfig(scale_by_group_std=False, task_normalization=True, eps=1e-12)
    adv = outcome_advantages(batch, config).advantages
    # Task std over g1 only is 5; counting g2's zeros would give sqrt(50/4) instead.
    assert adv == pytest.approx({"a1": -1.0, "a2": 1.0, "c1": 0.0, "c2": 0.0})


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        (returns(("a", "g", "t", 1.0), ("a", "g", "t", 0.0)), "appears twice"),
        (returns(("a", "g", "t1", 1.0), ("b", "g", "t2", 0.0)), "mixes tasks"),
        (returns(("a", "g", "t", math.nan)), "non-finite"),
    ],
)
def test_bad_returns_are_refused(batch: list[TrajectoryReturn], match: str) -> None:
    with pytest.raises(AdvantageInputError, match=match):
        outcome_advantages(batch, EXACT)


def test_within_group_variances() -> None:
    batch = returns(("a", "g1", "t", 1.0), ("b", "g1", "t", 0.0), ("c", "g2", "t", 2.0))
    assert within_group_reward_variances(batch) == [0.25, 0.0]


def step(tid: str, group: str, reward: float, action: list[int], version: int = 0) -> StepRecord:
    return StepRecord(tid, group, "task", version, [1, 2], action, [-0.5] * len(action), reward)


def test_steps_share_their_trajectory_return_and_advantage() -> None:
    steps = [
        # trajectory x: process reward 0.25 then outcome 0.75 -> return 1.0
        step("x", "g", 0.25, [5, 6]), step("x", "g", 0.75, [7]),
        step("y", "g", 0.0, [8]),
        step("y", "g", 0.0, []),  # nothing sampled: counts for the return, yields no sample
    ]
    samples, result = build_training_samples(steps, EXACT)
    assert [s.trajectory_id for s in samples] == ["x", "x", "y"]
    assert [s.advantage for s in samples] == pytest.approx([1.0, 1.0, -1.0])
    assert samples[0].action_token_ids == (5, 6)
    assert result.groups == 1


def test_trajectory_spanning_groups_is_refused() -> None:
    from learning_loop.batch import InvalidSampleError

    with pytest.raises(InvalidSampleError, match="different groups"):
        build_training_samples([step("x", "g1", 1.0, [5]), step("x", "g2", 0.0, [6])], EXACT)
