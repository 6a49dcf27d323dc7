"""Trajectory advantages for GRPO: group normalisation, optional task-level normalisation.

GRPO (Shao et al., 2024, DeepSeekMath) replaces a learned critic with the group baseline:
the G trajectories sampled for the same task and seed form a group and each one gets

    A_i = (R_i - mean_g(R)) / (std_g(R) + eps)

where R_i is the trajectory's return (the episode's total reward: outcome plus process
terms). The advantage is per trajectory and is broadcast to every action token of every
step of that trajectory (see learning_loop.batch).

Departures and choices:
- std is the population std (ddof=0), so a group of two with different rewards gets +-1;
  TRL uses ddof=1 (+-0.71). Only the scale differs.
- `scale_by_group_std=False` keeps R_i - mean_g only (Dr. GRPO, Liu et al., 2025), which
  avoids up-weighting groups whose rewards barely differ.
- `task_normalization=True` then divides every advantage by the std of the advantages of
  all informative groups of the same task (AgentRL's task-level normalisation), so a task
  with a large reward scale does not dominate a multi-task batch.
- A group whose rewards do not vary (all solved or all failed, or a single sample) carries
  no signal: its advantages are exactly 0 and it is counted in `zero_variance_groups`,
  which is an exploration signal for the stability monitors. Such groups are left out of
  the task-level statistics.

Pure python; no torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from triloop.run_config import AdvantageConfig


@dataclass(frozen=True)
class TrajectoryReturn:
    """One finished episode: its group (same task + seed), task and total reward."""

    trajectory_id: str
    group_id: str
    task_id: str
    total_reward: float


@dataclass(frozen=True)
class AdvantageResult:
    """Advantages by trajectory id plus how many groups carried no signal."""

    advantages: dict[str, float]
    groups: int
    zero_variance_groups: int

    @property
    def zero_variance_share(self) -> float:
        """Share of groups whose rewards did not vary (0..1)."""
        return self.zero_variance_groups / self.groups if self.groups else 0.0


class AdvantageInputError(ValueError):
    """The returns cannot be normalised as given (duplicates, mixed tasks, non-finite)."""


def mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (ddof=0)."""
    mean = math.fsum(values) / len(values)
    variance = math.fsum((v - mean) ** 2 for v in values) / len(values)
    return mean, math.sqrt(variance)


def compute_advantages(
    returns: Sequence[TrajectoryReturn], config: AdvantageConfig
) -> AdvantageResult:
    """Normalise trajectory returns within groups (and optionally tasks) into advantages."""
    groups = _group(returns)
    advantages: dict[str, float] = {}
    zero_variance = 0
    informative_by_task: dict[str, list[str]] = defaultdict(list)
    for members in groups.values():
        mean, std = mean_and_std([r.total_reward for r in members])
        if len(members) < 2 or std <= config.zero_variance_tolerance:
            zero_variance += 1
            advantages.update((r.trajectory_id, 0.0) for r in members)
            continue
        scale = std + config.eps if config.scale_by_group_std else 1.0
        for r in members:
            advantages[r.trajectory_id] = (r.total_reward - mean) / scale
        informative_by_task[members[0].task_id].extend(r.trajectory_id for r in members)
    if config.task_normalization:
        for ids in informative_by_task.values():
            # Group-centred advantages already have mean 0 per task; only the scale changes.
            _, task_std = mean_and_std([advantages[i] for i in ids])
            for i in ids:
                advantages[i] /= task_std + config.eps
    return AdvantageResult(advantages, groups=len(groups), zero_variance_groups=zero_variance)


def within_group_reward_variances(returns: Sequence[TrajectoryReturn]) -> list[float]:
    """Population variance of the returns of each group, in first-seen group order."""
    return [mean_and_std([r.total_reward for r in m])[1] ** 2 for m in _group(returns).values()]


def _group(returns: Sequence[TrajectoryReturn]) -> dict[str, list[TrajectoryReturn]]:
    groups: dict[str, list[TrajectoryReturn]] = {}
    seen: set[str] = set()
    for r in returns:
        if r.trajectory_id in seen:
            raise AdvantageInputError(f"trajectory {r.trajectory_id!r} appears twice")
        if not math.isfinite(r.total_reward):
            raise AdvantageInputError(
                f"trajectory {r.trajectory_id!r} has a non-finite return {r.total_reward!r};"
                " check the environment's reward rule"
            )
        seen.add(r.trajectory_id)
        members = groups.setdefault(r.group_id, [])
        if members and members[0].task_id != r.task_id:
            raise AdvantageInputError(
                f"group {r.group_id!r} mixes tasks {members[0].task_id!r} and {r.task_id!r};"
                " a group is one task and seed"
            )
        members.append(r)
    return groups
