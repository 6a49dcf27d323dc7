"""Partial rollouts, as the pure bookkeeping the training workflow does (issue 18).

With ``asynchrony.partial_rollouts`` an episode the batch deadline cut is not thrown
away: the run's next rollout batch continues it under the newer policy (the execution
loop resets the environment with the same seed and replays the stored actions, see
``execution_loop.partial_episodes``). Its turns keep the version that sampled them
(``step.policy_version``), so the update's off-policy guard (``update.max_staleness``,
``update.stale_samples``) judges each turn by its own age.

A cut episode never trains on its partial outcome:

- the update of the cut episode's iteration *holds* its group: none of the group trains
  then (the group baseline would lack the episode's final reward);
- the update of the iteration whose batch finished the continuation *carries* the group:
  the group's finished episodes of the earlier batch and the continuation train together;
  the cut row itself is truncated for the deadline and stays out
  (``asynchrony.truncated_episodes`` must not be ``train``);
- an episode still cut after ``asynchrony.max_continuations`` continuations is given up:
  its group is carried without it (the cut rows are left out, as without partial
  rollouts).
- an update is never left with every group held: when all of a batch's groups would wait
  and none is carried in, that batch continues nothing (``settle``).

Continuations ride only on an iteration's first batch (not on dynamic sampling's extra
rounds, whose cut episodes are simply left out). A continuation pending when the run
rolls back or continues as new is dropped, and its group's earlier episodes never train:
data lost, never a partial outcome learned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from triloop.workflow_api import ContinuedEpisode, RolloutItem


@dataclass(frozen=True)
class ContinuationPlan:
    """What to do with a batch's cut episodes."""

    continue_next: list[ContinuedEpisode] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)  # episode ids left to the truncation rule


def plan_continuations(
    cut: Sequence[str], *, items: Mapping[str, Sequence[RolloutItem]],
    continuations: Mapping[str, ContinuedEpisode], max_continuations: int,
) -> ContinuationPlan:
    """Which of a batch's ``cut`` episode ids to continue in the next batch.

    ``items``: each batch's groups (ids ``batch:index:sample`` name a group of it);
    ``continuations``: the continuation episodes sent so far, by their own episode id.
    An id of neither kind (another batch, a dynamic-sampling round) is given up.
    """
    plan = ContinuationPlan()
    for episode_id in cut:
        earlier = continuations.get(episode_id)
        if earlier is not None:
            if earlier.rounds >= max_continuations:
                plan.given_up.append(episode_id)
            else:
                plan.continue_next.append(replace(earlier, prior_episode_id=episode_id,
                                                  rounds=earlier.rounds + 1))
            continue
        fresh = _fresh(episode_id, items)
        if fresh is None:
            plan.given_up.append(episode_id)
        else:
            plan.continue_next.append(fresh)
    return plan


def _fresh(episode_id: str, items: Mapping[str, Sequence[RolloutItem]]
           ) -> ContinuedEpisode | None:
    parts = episode_id.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    batch_id, index, sample = parts[0], int(parts[1]), int(parts[2])
    groups = items.get(batch_id)
    if groups is None or index >= len(groups):
        return None
    item = groups[index]
    return ContinuedEpisode(episode_id, item.task_id, item.seed, f"{batch_id}:{index}", sample)


@dataclass(frozen=True)
class GroupsOfUpdate:
    """Groups an update leaves for later (held) and takes from earlier batches (carried)."""

    held: list[str]
    carried: list[str]


def groups_of_update(continued_here: Sequence[ContinuedEpisode],
                     continue_next: Sequence[ContinuedEpisode]) -> GroupsOfUpdate:
    """An iteration's held and carried groups.

    ``continued_here``: the continuations its batch carried; ``continue_next``: its cut
    episodes that the next batch continues. A group with any episode still running is
    held; a group whose continuations all came back here (finished or given up) is carried.
    """
    held = sorted({c.group_id for c in continue_next})
    carried = sorted({c.group_id for c in continued_here} - set(held))
    return GroupsOfUpdate(held, carried)


def settle(plan: ContinuationPlan, continued_here: Sequence[ContinuedEpisode],
           batch_groups: Sequence[str]) -> tuple[ContinuationPlan, GroupsOfUpdate]:
    """The plan and the update's groups, never holding back everything the update has.

    Holding every group of the batch, with nothing carried in, would leave the update no
    trajectory to learn from (a failed iteration). Then nothing is continued: the cut
    episodes are given up and left out by the truncation rule, as without partial
    rollouts, and groups of continuations cut again train without them.
    """
    groups = groups_of_update(continued_here, plan.continue_next)
    if groups.carried or not batch_groups or not set(batch_groups) <= set(groups.held):
        return plan, groups
    given_up = [*plan.given_up, *(c.prior_episode_id for c in plan.continue_next)]
    return ContinuationPlan([], given_up), groups_of_update(continued_here, [])
