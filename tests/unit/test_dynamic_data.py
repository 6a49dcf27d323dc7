"""Dynamic data: dynamic sampling, pass-rate filtering, the horizon curriculum."""

from __future__ import annotations

from typing import Any

import pytest

from execution_loop.episode import episode_limits
from learning_loop.advantages import TrajectoryTurns, compute_turn_advantages
from learning_loop.batch import TrainingSample, collate, without_groups
from learning_loop.batch_metrics import dynamic_sampling_series
from learning_loop.contracts import TaskSeed
from learning_loop.dynamic_data import (
    groups_to_resample,
    informative_groups,
    max_turns_at,
    record_pass_rates,
    rollout_items,
    tasks_for_sampling,
)
from learning_loop.objective import grpo_loss
from triloop.contracts import Limits
from triloop.run_config import ObjectiveConfig, RunConfig, RunConfigError, run_config_from_data
from triloop.workflow_api import RolloutBatchResult

TASKS = [TaskSeed("easy", 1, "v", "lake"), TaskSeed("mid", 2, "v", "lake"),
         TaskSeed("hard", 3, "v", "calc")]


def run_config(**sections: Any) -> RunConfig:
    data = {"name": "r", "model": {"base": "m"},
            "rollout": {"task_ids": ["easy", "mid", "hard"], "groups_per_iteration": 2}}
    data.update(sections)
    return run_config_from_data(data)


def batch_result(batch_id: str, groups: list[list[float]],
                 statuses: dict[str, str] | None = None) -> RolloutBatchResult:
    result = RolloutBatchResult(batch_id)
    for g, rewards in enumerate(groups):
        for s, reward in enumerate(rewards):
            episode = f"{batch_id}:{g}:{s}"
            result.rewards[episode] = reward
            result.successes[episode] = reward > 0.5
            result.statuses[episode] = (statuses or {}).get(episode, "completed")
    return result


def test_informative_groups_are_those_whose_rewards_vary() -> None:
    result = batch_result("b", [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.2, 0.3]])
    assert informative_groups(result, 1e-8) == 2
    # a failed episode does not count: the group left is one sample, no variance
    failed = batch_result("b", [[0.0, 1.0]], {"b:0:1": "failed"})
    assert informative_groups(failed, 1e-8) == 0


def test_resampling_tops_up_to_the_target_within_its_budget() -> None:
    off = run_config()
    assert groups_to_resample(off, informative=0, rounds_done=0) == 0
    on = run_config(sampling={"dynamic_sampling": True, "max_resample_rounds": 2})
    assert groups_to_resample(on, informative=0, rounds_done=0) == 2  # groups_per_iteration
    assert groups_to_resample(on, informative=1, rounds_done=1) == 1
    assert groups_to_resample(on, informative=2, rounds_done=0) == 0
    assert groups_to_resample(on, informative=0, rounds_done=2) == 0  # budget spent
    wider = run_config(sampling={"dynamic_sampling": True, "min_informative_groups": 5})
    assert groups_to_resample(wider, informative=3, rounds_done=0) == 2


def test_resample_rounds_continue_the_task_cycle() -> None:
    first = rollout_items(TASKS, 1, 2, 4)
    extra = rollout_items(TASKS, 1, 2, 4, offset=2, count=3)
    assert [i.task_id for i in first] == ["easy", "mid"]
    assert [i.task_id for i in extra] == ["hard", "easy", "mid"]


def test_dropping_zero_variance_groups_takes_their_tokens_out_of_the_denominator() -> None:
    turns = [TrajectoryTurns(tid, group, "t", (reward,)) for tid, group, reward in
             (("a", "solved", 1.0), ("b", "solved", 1.0), ("c", "mixed", 1.0), ("d", "mixed", 0.0))]
    result = compute_turn_advantages(turns, RunConfig.model_fields["advantage"].default)
    samples = [TrainingSample(t.trajectory_id, t.group_id, "t", 0, (1, 2), (3, 4, 5),
                              (-1.0, -1.0, -1.0), result.advantages[t.trajectory_id])
               for t in turns]
    kept = without_groups(samples, result.zero_variance_group_ids)
    assert [s.trajectory_id for s in kept] == ["c", "d"]

    def loss(chosen: list[TrainingSample]) -> float:
        batch = collate(chosen)
        logprobs = batch.behaviour_logprobs + 0.1 * batch.action_mask  # ratio != 1
        out = grpo_loss(logprobs, batch.behaviour_logprobs, batch.advantages,
                        batch.action_mask, ObjectiveConfig())
        return float(out.loss)

    # Zero-advantage tokens add nothing to the numerator but half of the denominator.
    assert loss(samples) == pytest.approx(loss(kept) / 2, rel=1e-5)
    assert dynamic_sampling_series(1, 2) == {"dynamic_sampling/groups_dropped": 1.0,
                                             "dynamic_sampling/drop_rate": 0.5}


def test_pass_rates_are_kept_per_task_over_a_window() -> None:
    items = rollout_items(TASKS, 1, 3, 2)
    result = batch_result("b", [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    history = record_pass_rates({"easy": [1.0, 1.0]}, items, "b", result, window=2)
    assert history == {"easy": [1.0, 1.0], "mid": [0.5], "hard": [0.0]}


def test_pass_rate_filter_drops_always_and_never_solved_tasks() -> None:
    sampling = run_config(sampling={"pass_rate_filter": True, "pass_rate_window": 2}).sampling
    history = {"easy": [1.0, 1.0], "mid": [0.5, 0.0], "hard": [0.0]}  # hard: window not full
    kept, filtered = tasks_for_sampling(TASKS, history, sampling)
    assert [t.task_id for t in kept] == ["mid", "hard"] and filtered == ["easy"]
    # never every task: a run with nothing left keeps sampling all of them
    solved = {"easy": [1.0, 1.0], "mid": [1.0, 1.0], "hard": [0.0, 0.0]}
    assert tasks_for_sampling(TASKS, solved, sampling) == (TASKS, [])
    # off by default
    assert tasks_for_sampling(TASKS, history, run_config().sampling) == (TASKS, [])


def test_horizon_curriculum_raises_max_turns_on_schedule() -> None:
    config = run_config(rollout={"task_ids": ["t"], "max_turns": 2}, sampling={
        "horizon_schedule": [{"from_iteration": 3, "max_turns": 4},
                             {"from_iteration": 6, "max_turns": 8}]})
    assert [max_turns_at(i, config) for i in (1, 2, 3, 5, 6, 50)] == [2, 2, 4, 4, 8, 8]
    assert max_turns_at(1, run_config()) is None  # the contract decides


def test_a_run_lowers_a_contracts_turn_limit_and_never_raises_it() -> None:
    contract = Limits(max_turns=6, wall_time_s=60, max_tokens_per_turn=32, max_total_tokens=512)
    assert episode_limits(contract, None) is contract
    assert episode_limits(contract, 2).max_turns == 2
    assert episode_limits(contract, 10).max_turns == 6


def test_a_run_lowers_a_contracts_token_limit_per_turn_and_never_raises_it() -> None:
    contract = Limits(max_turns=6, wall_time_s=60, max_tokens_per_turn=32, max_total_tokens=512)
    assert episode_limits(contract, None, None) is contract
    assert episode_limits(contract, None, 8).max_tokens_per_turn == 8
    assert episode_limits(contract, 2, 8).max_turns == 2
    assert episode_limits(contract, None, 64).max_tokens_per_turn == 32
    assert run_config().rollout.max_new_tokens is None  # the contract decides


@pytest.mark.parametrize(("sections", "path"), [
    ({"sampling": {"min_pass_rate": 0.9, "max_pass_rate": 0.1}}, "sampling.min_pass_rate"),
    ({"sampling": {"horizon_schedule": [{"from_iteration": 5, "max_turns": 2},
                                        {"from_iteration": 2, "max_turns": 4}]}},
     "sampling.horizon_schedule"),
    ({"sampling": {"max_resample_rounds": -1}}, "sampling.max_resample_rounds"),
    ({"sampling": {"horizon_schedule": [{"from_iteration": 0, "max_turns": 2}]}},
     "sampling.horizon_schedule[0].from_iteration"),
])
def test_bad_dynamic_data_settings_are_refused(sections: dict[str, Any], path: str) -> None:
    with pytest.raises(RunConfigError) as caught:
        run_config(**sections)
    assert path in {p.path for p in caught.value.problems}


def test_rollout_max_turns_defaults_to_the_contract() -> None:
    assert run_config().rollout.max_turns is None
