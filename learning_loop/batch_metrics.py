"""Per-iteration metric series of a rollout batch: reward and task success, per task and
per environment.

Stored under ``training_step.metrics["series"]`` as flat ``name -> number`` keys so that a
multi-task run can be read: ``reward/task/<task id>`` and ``reward/env/<environment
name>`` are the mean return of the iteration's trajectories of that task or environment.
``success/rate``, ``success/task/<task id>`` and ``success/env/<environment name>`` are the
share of them the environment's verdict called a success (reached the goal, the exact
answer, the pinned tests pass), which shaped reward can hide: a policy may earn more by
failing sooner. Trajectories whose success is unknown (None) count in no success key.
``reward/tag/<key>=<value>`` and ``success/tag/<key>=<value>`` are the same per tag of the
task (``task.tags``, for example ``difficulty=easy``): the run plan carries each task's
tags, since a task set's axes (domain, capability, difficulty) say more than task ids.
The run page charts every key and overlays keys that share a prefix. Pure python.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from learning_loop.advantages import TrajectoryReturn

TASK_REWARD_PREFIX = "reward/task/"
ENVIRONMENT_REWARD_PREFIX = "reward/env/"
SUCCESS_RATE = "success/rate"
TASK_SUCCESS_PREFIX = "success/task/"
ENVIRONMENT_SUCCESS_PREFIX = "success/env/"
TAG_REWARD_PREFIX = "reward/tag/"
TAG_SUCCESS_PREFIX = "success/tag/"


def reward_series(returns: Sequence[TrajectoryReturn]) -> dict[str, float]:
    """Mean return per task and per environment (trajectories without an environment name
    count for their task only)."""
    by_task: dict[str, list[float]] = defaultdict(list)
    by_environment: dict[str, list[float]] = defaultdict(list)
    for r in returns:
        by_task[r.task_id].append(r.total_reward)
        if r.environment:
            by_environment[r.environment].append(r.total_reward)
    series = {f"{TASK_REWARD_PREFIX}{k}": _mean(v) for k, v in by_task.items()}
    series.update({f"{ENVIRONMENT_REWARD_PREFIX}{k}": _mean(v) for k, v in by_environment.items()})
    return dict(sorted(series.items()))


def success_series(returns: Sequence[TrajectoryReturn]) -> dict[str, float]:
    """Success rate (0..1) overall, per task and per environment, over the trajectories
    whose success is known; no keys when none is."""
    known = [r for r in returns if r.success is not None]
    if not known:
        return {}
    by_task: dict[str, list[float]] = defaultdict(list)
    by_environment: dict[str, list[float]] = defaultdict(list)
    for r in known:
        won = 1.0 if r.success else 0.0
        by_task[r.task_id].append(won)
        if r.environment:
            by_environment[r.environment].append(won)
    series = {SUCCESS_RATE: _mean(1.0 if r.success else 0.0 for r in known)}
    series.update({f"{TASK_SUCCESS_PREFIX}{k}": _mean(v) for k, v in by_task.items()})
    series.update({f"{ENVIRONMENT_SUCCESS_PREFIX}{k}": _mean(v)
                   for k, v in by_environment.items()})
    return dict(sorted(series.items()))


def tag_series(returns: Sequence[TrajectoryReturn],
               task_tags: Mapping[str, Mapping[str, str]]) -> dict[str, float]:
    """Mean return and success rate per tag ``key=value`` of the trajectories' tasks.

    A trajectory counts once for each tag its task carries; tasks without tags (or not in
    ``task_tags``) count in no tag key, and success keys count known verdicts only.
    """
    rewards: dict[str, list[float]] = defaultdict(list)
    wins: dict[str, list[float]] = defaultdict(list)
    for r in returns:
        for key, value in sorted((task_tags.get(r.task_id) or {}).items()):
            label = f"{key}={value}"
            rewards[label].append(r.total_reward)
            if r.success is not None:
                wins[label].append(1.0 if r.success else 0.0)
    series = {f"{TAG_REWARD_PREFIX}{k}": _mean(v) for k, v in rewards.items()}
    series.update({f"{TAG_SUCCESS_PREFIX}{k}": _mean(v) for k, v in wins.items()})
    return dict(sorted(series.items()))


def dynamic_sampling_series(dropped_groups: int, groups: int) -> dict[str, float]:
    """What dynamic sampling dropped: zero-variance groups (count) and their share of all
    groups the iteration sampled, resampling rounds included (0..1)."""
    return {"dynamic_sampling/groups_dropped": float(dropped_groups),
            "dynamic_sampling/drop_rate": dropped_groups / groups if groups else 0.0}


def merge_series(*parts: Mapping[str, float] | None) -> dict[str, float]:
    """One series from several; later parts win on a shared key; non-finite values dropped."""
    merged: dict[str, float] = {}
    for part in parts:
        for key, value in (part or {}).items():
            if math.isfinite(value):
                merged[key] = float(value)
    return merged


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return math.fsum(values) / len(values)
