"""Advantages for GRPO: turn-level credit, and group, task or environment normalisation.

GRPO (Shao et al., 2024, DeepSeekMath) replaces a learned critic with the group baseline:
the G trajectories sampled for the same task and seed form a group. Each trajectory i is
a list of model turns t = 0..T_i-1 with rewards r_{i,t} (process rewards; the verifier's
outcome reward is added to the last turn). `AdvantageConfig.credit` picks what a turn is
credited with:

    outcome      A_{i,t} = (R_i - mean_g R) / s            R_i = sum_t r_{i,t}  (default)
    discounted   A_{i,t} = (G_{i,t} - mean_g G_{.,0}) / s
    turn_grpo    A_{i,t} = (G_{i,t} - mean_g G) / s        mean, std over every turn of g

with the return-to-go G_{i,t} = sum_{k>=t} gamma^(k-t) r_{i,k}.

- `outcome` broadcasts one number to every turn (GRPO as published; ToRL, DAPO). Use it
  when only the final outcome is rewarded and episodes are short.
- `discounted` credits a turn only with what came after it, against the group's mean
  return from the start: a process reward earned at turn 5 no longer rewards turns 0-4
  as much as turn 5 (gamma < 1 also prefers earlier success). With gamma = 1 and
  outcome-only rewards it equals `outcome`. Use it when environments return per-step
  rewards and horizons are long (AgentGym-RL, RAGEN-style multi-turn credit).
- `turn_grpo` pools the returns-to-go of every turn of every member of the group and
  normalises each one against that pool (turn-level GRPO), so turns are compared with
  the turns of the other members. Use it with dense process rewards whose scale varies
  between turns. Its baseline weighs each member by its number of turns, so even with
  outcome-only rewards and gamma = 1 it differs from `outcome` when lengths differ.

The centring is always within the group. The scale s is the first that applies of:
- `environment_normalization`: the std of the centred values of every informative group
  of the same environment (ERPO, AutoForge): environments with different reward scales
  or difficulty weigh the same in a mixed batch;
- `task_normalization`: the same over the groups of the same task (AgentRL);
- `scale_by_group_std`: the group's own std (GRPO); False keeps the centred value
  (Dr. GRPO, Liu et al., 2025, which avoids up-weighting groups that barely differ).
  The std is the population std (ddof=0): a group of two gets +-1 (TRL's ddof=1: +-0.71).

Why task normalisation *replaces* the group std instead of rescaling after it: after
division by its own std every informative group has std 1, so the std of a task's pooled,
group-centred advantages is 1 as well and a second division changes nothing (an outside
review checked this numerically; `tests/unit/test_advantages.py` keeps the check). Dividing
by the task's std of centred returns is what equalises reward scales across tasks.

A group whose baseline values do not vary (all solved or all failed, or a single sample)
carries no signal: every advantage in it is exactly 0, it is counted in
`zero_variance_groups` (an exploration signal for the stability monitors) and listed in
`zero_variance_group_ids` (dynamic sampling drops those), and it is left out of the task
and environment statistics.

Pure python; no torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from triloop.run_config import AdvantageConfig


@dataclass(frozen=True)
class TrajectoryReturn:
    """One finished episode: its group (same task + seed), task and total reward."""

    trajectory_id: str
    group_id: str
    task_id: str
    total_reward: float
    environment: str = ""  # the environment's name, for environment-level normalisation
    success: bool | None = None  # the task's verdict, apart from shaped reward (None: unknown)


@dataclass(frozen=True)
class TrajectoryTurns:
    """One finished episode as turn rewards (outcome reward included in the last one)."""

    trajectory_id: str
    group_id: str
    task_id: str
    turn_rewards: tuple[float, ...]
    environment: str = ""

    @property
    def total_reward(self) -> float:
        """The episode's return (undiscounted sum of its turn rewards)."""
        return math.fsum(self.turn_rewards)


@dataclass(frozen=True)
class AdvantageResult:
    """Advantages by trajectory id plus how many groups carried no signal.

    `advantages` holds each trajectory's first-turn advantage (its only one under
    `outcome`); `turn_advantages` holds one per turn.
    """

    advantages: dict[str, float]
    groups: int
    zero_variance_groups: int
    turn_advantages: dict[str, tuple[float, ...]] = field(default_factory=dict)
    zero_variance_group_ids: frozenset[str] = frozenset()


_R = TypeVar("_R", "TrajectoryReturn", "TrajectoryTurns")


class AdvantageInputError(ValueError):
    """The returns cannot be normalised as given (duplicates, mixed tasks, non-finite)."""


def mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (ddof=0)."""
    mean = math.fsum(values) / len(values)
    variance = math.fsum((v - mean) ** 2 for v in values) / len(values)
    return mean, math.sqrt(variance)


def returns_to_go(rewards: Sequence[float], gamma: float) -> tuple[float, ...]:
    """G_t = sum_{k>=t} gamma^(k-t) r_k for every turn t."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return tuple(out)


def compute_turn_advantages(
    trajectories: Sequence[TrajectoryTurns], config: AdvantageConfig
) -> AdvantageResult:
    """Per-turn advantages under `config.credit`, centred in the group, scaled per config."""
    groups = _group(trajectories)
    values: dict[str, tuple[float, ...]] = {}  # per turn, before centring
    baseline_points: dict[str, list[float]] = {}  # per group: what mean and std are over
    for group_id, members in groups.items():
        points: list[float] = []
        for t in members:
            values[t.trajectory_id], own = _turn_values(t, config)
            points.extend(own)
        baseline_points[group_id] = points
    centred: dict[str, tuple[float, ...]] = {}
    zero_variance: set[str] = set()
    centred_points_by: dict[str, list[float]] = defaultdict(list)  # scope key -> points
    group_scale: dict[str, float] = {}
    for group_id, members in groups.items():
        mean, std = mean_and_std(baseline_points[group_id])
        if len(members) < 2 or std <= config.zero_variance_tolerance:
            zero_variance.add(group_id)
            for t in members:
                centred[t.trajectory_id] = (0.0,) * len(values[t.trajectory_id])
            continue
        group_scale[group_id] = std
        for t in members:
            centred[t.trajectory_id] = tuple(v - mean for v in values[t.trajectory_id])
        scope = _scope_key(members[0], config)
        if scope is not None:
            centred_points_by[scope].extend(p - mean for p in baseline_points[group_id])
    scope_std = {key: mean_and_std(points)[1] for key, points in centred_points_by.items()}
    turn_advantages: dict[str, tuple[float, ...]] = {}
    for group_id, members in groups.items():
        if group_id in zero_variance:
            scale = 1.0
        else:
            scope = _scope_key(members[0], config)
            if scope is not None:
                scale = scope_std[scope] + config.eps
            elif config.scale_by_group_std:
                scale = group_scale[group_id] + config.eps
            else:
                scale = 1.0
        for t in members:
            turn_advantages[t.trajectory_id] = tuple(c / scale for c in centred[t.trajectory_id])
    first = {tid: adv[0] if adv else 0.0 for tid, adv in turn_advantages.items()}
    return AdvantageResult(first, groups=len(groups), zero_variance_groups=len(zero_variance),
                           turn_advantages=turn_advantages,
                           zero_variance_group_ids=frozenset(zero_variance))


def _turn_values(
    trajectory: TrajectoryTurns, config: AdvantageConfig
) -> tuple[tuple[float, ...], list[float]]:
    """(value of each turn, this trajectory's contribution to its group's baseline)."""
    rewards = trajectory.turn_rewards or (0.0,)
    if config.credit == "outcome":
        total = math.fsum(rewards)
        return (total,) * len(rewards), [total]
    to_go = returns_to_go(rewards, config.gamma)
    if config.credit == "discounted":
        return to_go, [to_go[0]]
    return to_go, list(to_go)  # turn_grpo: every turn is a baseline point


def _scope_key(member: TrajectoryTurns, config: AdvantageConfig) -> str | None:
    if config.environment_normalization:
        return f"env:{member.environment}"
    if config.task_normalization:
        return f"task:{member.task_id}"
    return None


def within_group_reward_variances(returns: Sequence[TrajectoryReturn]) -> list[float]:
    """Population variance of the returns of each group, in first-seen group order."""
    return [mean_and_std([r.total_reward for r in m])[1] ** 2 for m in _group(returns).values()]


def _group(returns: Sequence[_R]) -> dict[str, list[_R]]:
    groups: dict[str, list[_R]] = {}
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
