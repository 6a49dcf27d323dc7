"""Dynamic data, as pure functions the training workflow calls: which tasks and groups.

- **Dynamic sampling** (DAPO, Yu et al., 2025): a group whose rewards do not vary has
  advantage 0 everywhere and teaches nothing, yet under token aggregation its tokens
  dilute the loss. `informative_groups` counts the groups of a rollout batch with reward
  variance; the workflow samples more groups (`resample_items`) until the iteration has
  enough or its budget of extra batches is spent, and the learner drops the rest.
- **Pass-rate filtering**: a task whose success rate over its last `pass_rate_window`
  groups is outside [min_pass_rate, max_pass_rate] is not sampled; it is always solved or
  never solved, so its groups have no variance. Never filters every task.
- **Horizon curriculum** (ScalingInter-RL, AgentGym-RL): `max_turns_at` gives the turn
  limit of an iteration from `sampling.horizon_schedule`.
- **Curriculum by tag**: `curriculum_tasks` keeps the run's tasks whose tags match the
  iteration's `rollout.curriculum` stage (triloop.curriculum), before pass-rate filtering.

Every task these functions return comes from the run plan, i.e. was admitted by
governance: the learner never sees anything else. Deterministic and torch-free, so the
workflow can call them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from learning_loop.contracts import TaskSeed
from triloop import curriculum
from triloop.run_config import RunConfig, SamplingConfig
from triloop.statuses import EpisodeStatus
from triloop.workflow_api import RolloutBatchResult, RolloutItem

USABLE = (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED)


def rollout_items(tasks: Sequence[TaskSeed], iteration: int, groups: int, group_size: int,
                  *, offset: int = 0, count: int | None = None) -> list[RolloutItem]:
    """The iteration's ``groups`` groups, cycling through the tasks. A resampling round
    asks for ``count`` more, after the ``offset`` groups already drawn this iteration."""
    start = (iteration - 1) * groups + offset
    return [RolloutItem(tasks[(start + g) % len(tasks)].task_id,
                        tasks[(start + g) % len(tasks)].seed, group_size)
            for g in range(groups if count is None else count)]


def group_rewards(result: RolloutBatchResult) -> dict[str, list[float]]:
    """Rewards of the batch's usable episodes by group (episode ids are ``group:sample``)."""
    groups: dict[str, list[float]] = {}
    for episode_id, reward in result.rewards.items():
        if result.statuses.get(episode_id) in USABLE:
            groups.setdefault(episode_id.rsplit(":", 1)[0], []).append(reward)
    return groups


def informative_groups(result: RolloutBatchResult, tolerance: float) -> int:
    """Groups of the batch whose rewards vary (population std above ``tolerance``)."""
    return sum(1 for rewards in group_rewards(result).values() if _std(rewards) > tolerance)


def groups_to_resample(config: RunConfig, informative: int, rounds_done: int) -> int:
    """How many more groups to sample now (0: enough, disabled, or budget spent)."""
    sampling = config.sampling
    if not sampling.dynamic_sampling or rounds_done >= sampling.max_resample_rounds:
        return 0
    target = sampling.min_informative_groups or config.rollout.groups_per_iteration
    return max(0, target - informative)


def record_pass_rates(history: Mapping[str, Sequence[float]], items: Sequence[RolloutItem],
                      batch_id: str, result: RolloutBatchResult, window: int
                      ) -> dict[str, list[float]]:
    """``history`` plus each group's success rate, per task, keeping the last ``window``."""
    updated = {task: list(rates) for task, rates in history.items()}
    for index, item in enumerate(items):
        ids = [f"{batch_id}:{index}:{s}" for s in range(item.group_size)]
        played = [i for i in ids if result.statuses.get(i) in USABLE]
        if not played:
            continue
        rate = sum(1 for i in played if result.successes.get(i)) / len(played)
        updated[item.task_id] = [*updated.get(item.task_id, []), rate][-window:]
    return updated


def tasks_for_sampling(tasks: Sequence[TaskSeed], history: Mapping[str, Sequence[float]],
                       sampling: SamplingConfig) -> tuple[list[TaskSeed], list[str]]:
    """(tasks to sample, ids filtered out by their pass rate); never an empty list."""
    if not sampling.pass_rate_filter:
        return list(tasks), []
    kept, filtered = [], []
    for task in tasks:
        rates = list(history.get(task.task_id, []))[-sampling.pass_rate_window:]
        rate = sum(rates) / len(rates) if rates else None
        full = len(rates) >= sampling.pass_rate_window
        if full and rate is not None and not (
                sampling.min_pass_rate <= rate <= sampling.max_pass_rate):
            filtered.append(task.task_id)
        else:
            kept.append(task)
    if not kept:  # every task solved or hopeless: keep training on all rather than stop
        return list(tasks), []
    return kept, filtered


def curriculum_tasks(tasks: Sequence[TaskSeed], iteration: int, config: RunConfig
                     ) -> list[TaskSeed]:
    """The run's tasks the iteration's curriculum stage selects (all without a curriculum).

    The workflow refuses, before the first rollout, a curriculum with a stage that selects
    none (``triloop.curriculum.curriculum_problems``), so this is never empty then.
    """
    stages = config.rollout.curriculum
    return curriculum.select(iteration, stages, tasks, lambda t: t.tags)


def curriculum_series(iteration: int, config: RunConfig, sampled: int) -> dict[str, float]:
    """The iteration's stage (1-based; 0 before the first) and how many tasks it samples."""
    stages = config.rollout.curriculum
    if not stages:
        return {}
    stage = curriculum.stage_at(iteration, stages)
    return {"curriculum/stage": float(0 if stage is None else stages.index(stage) + 1),
            "curriculum/tasks": float(sampled)}


def max_turns_at(iteration: int, config: RunConfig) -> int | None:
    """The turn limit of an iteration: the last stage started by then, else rollout's."""
    limit = config.rollout.max_turns
    for stage in config.sampling.horizon_schedule:
        if stage.from_iteration <= iteration:
            limit = stage.max_turns
    return limit


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
