"""Per-task and per-environment reward and success series, and the learner's admitted-task
check."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from learning_loop.advantages import TrajectoryReturn
from learning_loop.batch_metrics import merge_series, reward_series, success_series
from learning_loop.trajectory_reader import (
    StoredStep,
    StoredTrajectory,
    TaskNotInRun,
    check_admitted,
    to_rollout_data,
)
from triloop.models import TrainingStep
from web.data.runs import numeric_metrics


def test_reward_per_task_and_per_environment() -> None:
    returns = [
        TrajectoryReturn("a", "g1", "lake-1", 1.0, "frozen_lake"),
        TrajectoryReturn("b", "g1", "lake-1", 0.0, "frozen_lake"),
        TrajectoryReturn("c", "g2", "lake-2", 1.0, "frozen_lake"),
        TrajectoryReturn("d", "g3", "sum", 0.25, "tool_arithmetic"),
        TrajectoryReturn("e", "g4", "orphan", 3.0),  # no environment name: task only
    ]
    assert reward_series(returns) == pytest.approx({
        "reward/task/lake-1": 0.5, "reward/task/lake-2": 1.0, "reward/task/sum": 0.25,
        "reward/task/orphan": 3.0,
        "reward/env/frozen_lake": 2 / 3, "reward/env/tool_arithmetic": 0.25,
    })


def test_success_rate_overall_per_task_and_per_environment_apart_from_reward() -> None:
    returns = [
        # A shaped reward can rank a failure above a success; the rate counts verdicts only.
        TrajectoryReturn("a", "g1", "lake-1", 0.3, "frozen_lake", success=False),
        TrajectoryReturn("b", "g1", "lake-1", 0.1, "frozen_lake", success=True),
        TrajectoryReturn("c", "g2", "lake-2", 0.2, "frozen_lake", success=False),
        TrajectoryReturn("d", "g3", "sum", 1.0, "tool_arithmetic", success=True),
        TrajectoryReturn("e", "g4", "orphan", 1.0, success=False),  # task only
        TrajectoryReturn("f", "g5", "served", 1.0, "service", success=None),  # unknown
    ]
    assert success_series(returns) == pytest.approx({
        "success/rate": 2 / 5,
        "success/task/lake-1": 0.5, "success/task/lake-2": 0.0, "success/task/sum": 1.0,
        "success/task/orphan": 0.0,
        "success/env/frozen_lake": 1 / 3, "success/env/tool_arithmetic": 1.0,
    })
    assert success_series(returns[-1:]) == {}  # nothing known: no keys, not a rate of 0


def test_stored_success_reaches_the_returns() -> None:
    won = StoredTrajectory("a", "g", "t1", 0, 0.1, [StoredStep(0, [1], [2], [0, 1], [-0.1], 0.0)],
                           "lake", success=True)
    assert [r.success for r in to_rollout_data([won, trajectory("b", "t1")]).returns] == [
        True, None]


def test_merge_series_drops_non_finite_values() -> None:
    assert merge_series({"a": 1.0}, None, {"b": math.nan, "a": 2.0}) == {"a": 2.0}


def trajectory(tid: str, task: str, environment: str = "") -> StoredTrajectory:
    step = StoredStep(0, [1], [2], [0, 1], [-0.1], 0.0)
    return StoredTrajectory(tid, "g", task, 0, 1.0, [step], environment)


def test_the_learner_refuses_trajectories_of_tasks_outside_the_run() -> None:
    check_admitted([trajectory("a", "t1")], {"t1": "lake"})
    with pytest.raises(TaskNotInRun, match="not among the run's admitted"):
        check_admitted([trajectory("a", "t1"), trajectory("b", "t9")], {"t1": "lake"})


def test_environment_names_reach_returns_and_steps() -> None:
    data = to_rollout_data([trajectory("a", "t1", "lake")])
    assert data.returns[0].environment == "lake"
    assert {s.environment for s in data.steps} == {"lake"}


def test_metric_points_carry_the_stored_series() -> None:
    row = TrainingStep(run_id="r", iteration=1, created_at=datetime.now(UTC), metrics={
        "series": {"reward/task/t": 0.5, "flag": True, "text": "x"}})
    assert numeric_metrics(row.metrics, row.length_stats) == {"reward/task/t": 0.5}
    assert numeric_metrics({}, None) == {}
