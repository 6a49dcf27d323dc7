"""Partial rollouts' bookkeeping: what is continued, which groups wait, each turn's version."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from execution_loop.partial_episodes import ContinuationRefused, check_continuable
from execution_loop.workflows import EpisodeSummary, plan_episodes, summarize
from learning_loop.partial_rollouts import groups_of_update, plan_continuations
from learning_loop.trajectory_reader import StoredStep, StoredTrajectory, to_rollout_data
from triloop.run_config import RunConfig, RunConfigError
from triloop.workflow_api import (
    ContinuedEpisode,
    RolloutBatchInput,
    RolloutItem,
    continuation_episode_id,
)

ITEMS = {"run-2-a": [RolloutItem("t1", 11, 2), RolloutItem("t2", 22, 2)]}


def test_a_cut_episode_is_continued_in_its_group_with_its_task_and_seed() -> None:
    plan = plan_continuations(["run-2-a:1:0"], items=ITEMS, continuations={},
                              max_continuations=2)
    assert plan.continue_next == [ContinuedEpisode("run-2-a:1:0", "t2", 22, "run-2-a:1", 0, 1)]
    assert plan.given_up == []


def test_a_continuation_cut_again_goes_on_until_the_bound_then_is_given_up() -> None:
    first = ContinuedEpisode("run-2-a:1:0", "t2", 22, "run-2-a:1", 0, 1)
    again = continuation_episode_id("run-3-b", 0, first)
    assert again == "run-3-b:p0:0"
    plan = plan_continuations([again], items=ITEMS, continuations={again: first},
                              max_continuations=2)
    assert plan.continue_next == [ContinuedEpisode(again, "t2", 22, "run-2-a:1", 0, 2)]
    second = plan.continue_next[0]
    third = continuation_episode_id("run-4-c", 0, second)
    spent = plan_continuations([third], items=ITEMS, continuations={third: second},
                               max_continuations=2)
    assert spent.continue_next == [] and spent.given_up == [third]


def test_an_episode_of_an_unknown_batch_or_group_is_given_up() -> None:
    plan = plan_continuations(["other-1-x:0:0", "run-2-a:5:0", "run-2-a:r1:0", "odd"],
                              items=ITEMS, continuations={}, max_continuations=2)
    assert plan.continue_next == [] and len(plan.given_up) == 4


def test_groups_wait_while_an_episode_runs_on_and_train_once_all_came_back() -> None:
    g1 = ContinuedEpisode("b1:0:0", "t", 1, "b1:0", 0)
    g1_other = ContinuedEpisode("b1:0:1", "t", 1, "b1:0", 1)
    g2 = ContinuedEpisode("b1:1:0", "t", 2, "b1:1", 0)
    fresh = ContinuedEpisode("b2:0:1", "t", 3, "b2:0", 1)
    # b1:0 had two continuations; one was cut again: the group still waits.
    groups = groups_of_update([g1, g1_other, g2], [g1_other, fresh])
    assert groups.held == ["b1:0", "b2:0"] and groups.carried == ["b1:1"]
    assert groups_of_update([], []).held == [] == groups_of_update([], []).carried


def test_the_execution_loop_plans_continuations_under_their_own_ids_and_the_old_group() -> None:
    episode = ContinuedEpisode("run-2-a:1:0", "t2", 22, "run-2-a:1", 0)
    batch = RolloutBatchInput("run-3-b", "training", [RolloutItem("t1", 11, 1)],
                              checkpoint_id="c1", run_id="run", policy_version=1,
                              continue_episodes=[episode])
    specs = plan_episodes(batch, "c1")
    assert [s.episode_id for s in specs] == ["run-3-b:0:0", "run-3-b:p0:0"]
    continued = specs[1]
    assert (continued.continues, continued.group_id, continued.task_id, continued.task_seed) \
        == ("run-2-a:1:0", "run-2-a:1", "t2", 22)
    assert specs[0].continues is None


def test_only_training_episodes_the_batch_deadline_cut_are_reported_cut() -> None:
    batch = RolloutBatchInput("b", "training", [RolloutItem("t", 1, 4)], checkpoint_id="c")
    specs = plan_episodes(batch, "c")
    summaries = {
        "b:0:0": EpisodeSummary("b:0:0", "truncated", failure_reason="deadline"),
        "b:0:1": EpisodeSummary("b:0:1", "truncated", failure_reason="max_turns"),
        "b:0:2": EpisodeSummary("b:0:2", "completed"),
    }
    statuses = {**{k: v.status for k, v in summaries.items()}, "b:0:3": "truncated"}
    result = summarize("b", specs, summaries, statuses, set(statuses), {"b:0:3"})
    assert result.cut_episodes == ["b:0:0", "b:0:3"]
    for spec in specs:
        spec.purpose = "eval"
    assert summarize("b", specs, summaries, statuses, set(statuses), {"b:0:3"}
                     ).cut_episodes == []


def test_each_turn_trains_under_the_version_that_sampled_it() -> None:
    def step(index: int, version: int | None) -> StoredStep:
        return StoredStep(index, [1, 2], [7], [0, 0, 1], [-0.5], 0.0, version)

    continued = StoredTrajectory("b3:p0:0", "b2:1", "t", 2, 1.0,
                                 [step(0, 1), step(1, 1), step(2, None)])
    data = to_rollout_data([continued], "exclude_clock")
    assert [s.policy_version for s in data.steps] == [1, 1, 2, 2]  # + the outcome record
    assert data.policy_versions == [2]


def test_a_cut_episode_of_another_run_group_or_purpose_is_not_continued() -> None:
    def stored(**overrides: Any) -> Any:
        values = {"purpose": "training", "run_id": "r", "task_id": "t", "group_id": "g",
                  "status": "truncated"}
        return SimpleNamespace(**{**values, **overrides})

    check = {"prior_id": "p", "run_id": "r", "task_id": "t", "group_id": "g"}
    assert check_continuable(stored(), **check) is not None
    for bad in ({"run_id": "other"}, {"purpose": "eval"}, {"group_id": "h"},
                {"task_id": "u"}, {"status": "completed"}):
        with pytest.raises(ContinuationRefused):
            check_continuable(stored(**bad), **check)
    with pytest.raises(ContinuationRefused, match="not stored"):
        check_continuable(None, **check)


def test_partial_rollouts_refuse_a_rule_that_trains_cut_episodes() -> None:
    base: dict[str, Any] = {"name": "r", "model": {"base": "tiny"},
                            "rollout": {"task_ids": ["t"]}}
    assert RunConfig.model_validate(base).asynchrony.partial_rollouts is False
    ok = RunConfig.model_validate({**base, "asynchrony": {"partial_rollouts": True}})
    assert ok.asynchrony.max_continuations == 2
    with pytest.raises(RunConfigError, match="asynchrony.partial_rollouts"):
        RunConfig.model_validate({**base, "asynchrony": {
            "partial_rollouts": True, "truncated_episodes": "train"}})


def test_an_update_is_never_left_with_every_group_held() -> None:
    from learning_loop.partial_rollouts import ContinuationPlan, settle

    cut = ContinuedEpisode("b1:0:0", "t", 1, "b1:0", 0)
    other = ContinuedEpisode("b1:1:1", "t", 2, "b1:1", 1)
    # One of two groups waits: the plan stands.
    plan, groups = settle(ContinuationPlan([cut]), [], ["b1:0", "b1:1"])
    assert plan.continue_next == [cut] and groups.held == ["b1:0"]
    # Both would wait and nothing is carried in: nothing is continued, nothing held.
    plan, groups = settle(ContinuationPlan([cut, other]), [], ["b1:0", "b1:1"])
    assert plan.continue_next == [] and plan.given_up == ["b1:0:0", "b1:1:1"]
    assert groups.held == [] == groups.carried
    # A continuation cut again is then given up too, and its old group trains now.
    back = ContinuedEpisode("b0:0:0", "t", 3, "b0:0", 0)
    again = ContinuedEpisode("b1:p0:0", "t", 3, "b0:0", 0, 2)
    plan, groups = settle(ContinuationPlan([cut, again]), [back], ["b1:0"])
    assert plan.continue_next == [] and groups.held == [] and groups.carried == ["b0:0"]
    # With a group carried in, the update has data: the batch's groups may all wait.
    finished = ContinuedEpisode("b0:1:0", "t", 4, "b0:1", 0)
    plan, groups = settle(ContinuationPlan([cut]), [finished], ["b1:0"])
    assert plan.continue_next == [cut] and groups.carried == ["b0:1"]
