"""Configurable asynchrony: the staleness window and the rule for truncated episodes."""

from __future__ import annotations

import pytest

from learning_loop.asynchrony import learns_from, rollouts_to_start
from learning_loop.batch import build_training_samples
from learning_loop.batch_metrics import reward_series
from learning_loop.trajectory_reader import StoredStep, StoredTrajectory, to_rollout_data
from triloop.run_config import AdvantageConfig, RunConfigError, run_config_from_data


@pytest.mark.parametrize(("status", "reason", "rule", "learns"), [
    ("completed", None, "exclude_all", True),
    ("truncated", "max_turns", "exclude_clock", True),  # the environment's own horizon
    ("truncated", "context_length", "exclude_clock", True),
    ("truncated", "batch_deadline", "exclude_clock", False),
    ("truncated", "deadline", "exclude_clock", False),
    ("truncated", "wall_time", "exclude_clock", False),
    ("truncated", None, "exclude_clock", False),  # unknown: treated as clock-cut
    ("truncated", "max_turns", "exclude_all", False),
    ("truncated", "batch_deadline", "train", True),
])
def test_which_truncated_episodes_train(status: str, reason: str | None, rule: str,
                                        learns: bool) -> None:
    assert learns_from(status, reason, rule) is learns  # type: ignore[arg-type]


def test_window_one_is_the_one_step_overlap() -> None:
    # after iteration k's batch arrived, nothing else in flight: start k + 2 only
    assert rollouts_to_start(next_iteration=3, in_flight=0, window=1, last_iteration=10) == [3]
    assert rollouts_to_start(next_iteration=11, in_flight=0, window=1, last_iteration=10) == []


def test_a_wider_window_keeps_k_rollouts_in_flight_within_the_cycle() -> None:
    assert rollouts_to_start(next_iteration=3, in_flight=0, window=3, last_iteration=10) == [
        3, 4, 5]
    assert rollouts_to_start(next_iteration=6, in_flight=2, window=3, last_iteration=10) == [6]
    assert rollouts_to_start(next_iteration=9, in_flight=0, window=4, last_iteration=10) == [
        9, 10]


def test_a_window_the_off_policy_guard_would_throw_away_is_refused() -> None:
    base = {"name": "r", "model": {"base": "m"}, "rollout": {"task_ids": ["t"]}}
    with pytest.raises(RunConfigError) as caught:
        run_config_from_data({**base, "asynchrony": {"staleness_window": 3}})
    assert "asynchrony.staleness_window" in str(caught.value)
    ok = run_config_from_data({**base, "asynchrony": {"staleness_window": 3},
                               "update": {"max_staleness": 3}})
    assert ok.asynchrony.staleness_window == 3
    # window 1, the overlap runs always had, stays valid whatever max_staleness says
    legacy = run_config_from_data({**base, "update": {"max_staleness": 0}})
    assert legacy.asynchrony.staleness_window == 1
    corrected = run_config_from_data({**base, "asynchrony": {"staleness_window": 2},
                                      "update": {"stale_samples": "importance_correct"}})
    assert corrected.asynchrony.staleness_window == 2


def episode(tid: str, task: str, turns: int, reward: float, status: str = "completed",
            reason: str | None = None) -> StoredTrajectory:
    steps = [StoredStep(i, [1, 2], [3 + i], [0, 0, 1], [-0.5], 0.0) for i in range(turns)]
    return StoredTrajectory(tid, f"{task}-g", task, 0, reward, steps, "env", status, reason)


def long_and_short_tasks() -> list[StoredTrajectory]:
    """A short task that always finishes, and a long one where the batch deadline cut two
    of four episodes halfway (partial reward 0) while the two that finished both succeeded."""
    return [
        episode("s1", "short", 2, 1.0), episode("s2", "short", 2, 0.0),
        episode("s3", "short", 2, 1.0), episode("s4", "short", 2, 0.0),
        episode("l1", "long", 12, 1.0), episode("l2", "long", 12, 1.0),
        episode("l3", "long", 6, 0.0, "truncated", "batch_deadline"),
        episode("l4", "long", 6, 0.0, "truncated", "batch_deadline"),
    ]


def test_a_long_episode_task_is_not_biased_toward_truncation() -> None:
    config = AdvantageConfig(eps=1e-12)
    # Before: the cut episodes count as finished failures. Their turns, the same early
    # moves a finishing episode makes, get a negative advantage, and the long task's
    # reward reads 0.5 although every episode that finished succeeded.
    naive = to_rollout_data(long_and_short_tasks(), "train")
    samples, _ = build_training_samples(naive.steps, config)
    cut = [s.advantage for s in samples if s.trajectory_id in ("l3", "l4")]
    assert cut == pytest.approx([-1.0] * 12)
    assert reward_series(naive.returns)["reward/task/long"] == 0.5

    # The rule: clock-cut episodes are left out, neither failure nor success.
    data = to_rollout_data(long_and_short_tasks(), "exclude_clock")
    assert data.truncated_excluded == 2
    samples, result = build_training_samples(data.steps, config)
    assert not any(s.trajectory_id in ("l3", "l4") for s in samples)
    # No negative signal reaches the long task: both finished episodes solved it, so its
    # group has no variance (nothing to learn, nothing pushed toward stopping early) ...
    assert {s.advantage for s in samples if s.task_id == "long"} == {0.0}
    assert "long-g" in result.zero_variance_group_ids
    # ... its reward is that of its finished episodes, and the short task is unchanged.
    assert reward_series(data.returns) == {"reward/task/long": 1.0, "reward/task/short": 0.5,
                                           "reward/env/env": 2 / 3}
    assert [s.advantage for s in samples if s.task_id == "short"] == pytest.approx(
        [1.0, 1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0])


def test_an_episode_the_horizon_ended_still_trains_as_a_failure() -> None:
    trajectories = [episode("a", "t", 3, 1.0), episode("b", "t", 8, 0.0, "truncated", "max_turns")]
    data = to_rollout_data(trajectories, "exclude_clock")
    samples, _ = build_training_samples(data.steps, AdvantageConfig(eps=1e-12))
    assert data.truncated_excluded == 0
    assert [s.advantage for s in samples if s.trajectory_id == "b"] == pytest.approx([-1.0] * 8)


def test_the_overlap_model_follows_the_workflow_rule() -> None:
    from bench.overlap import simulate

    runs = {k: simulate(k, iterations=60, slots=8, episodes=16, update_time=3.0, sigma=1.0,
                        seed=1) for k in (1, 2, 4)}
    # A wider window never leaves the learner waiting longer, and the data gets older:
    # at most k versions, on average more than with k = 1.
    assert runs[1].learner_idle >= runs[2].learner_idle >= runs[4].learner_idle
    assert runs[1].mean_staleness < runs[2].mean_staleness < runs[4].mean_staleness <= 4


def test_the_measured_overlap_bench_reads_idle_time_as_the_complement_of_a_union() -> None:
    from bench.overlap_measured import batch_wait, covered, idle_share

    # Overlapping and nested intervals count once; parts outside the span not at all.
    assert covered([(0.0, 2.0), (1.0, 3.0), (1.5, 1.7), (9.0, 12.0)], 0.0, 10.0) == 4.0
    assert idle_share([(0.0, 2.0), (5.0, 7.0)], 0.0, 10.0) == pytest.approx(0.6)
    assert idle_share([], 3.0, 3.0) == 0.0
    # Learner: waited 0-1 for batch 1, then ran 1-2; batch 2 was back at 1.5 (no wait), the
    # update began at 2.5 (orchestration); batch 3 came back at 5 after update 2 ended at 3.5.
    rollouts = [(0.0, 1.0), (0.5, 1.5), (1.6, 5.0)]
    updates = [(1.0, 2.0), (2.5, 3.5), (5.2, 6.0)]
    assert batch_wait(rollouts, updates, 0.0) == pytest.approx(1.0 + 0.0 + 1.5)
