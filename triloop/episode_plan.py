"""The episodes a batch is asked for, each under its deterministic id.

A batch's requester records this plan (``rollout_batch.planned_episodes``) when it asks
(governance for its eval batches, the web service for people's production traffic,
execution's Nexus handler for learning's training batches). The database then stores only
those episodes (each once: the id is the trajectory's key), and the gates count only
them. The execution loop plays the same list (``execution_loop.workflows.plan_episodes``),
so the plan and what is played are one derivation, not two.

A production episode may have a shadow beside it, ``<episode id>:shadow``; the plan names
the production episode only (the shadow's checkpoint is routing's, chosen when it runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from triloop.workflow_api import RolloutBatchInput, continuation_episode_id

SHADOW_SUFFIX = ":shadow"


@dataclass(frozen=True)
class PlannedEpisode:
    """One planned episode: its id, task and seed, and its place in a group."""

    episode_id: str
    task_id: str
    seed: int
    group_id: str
    sample_index: int
    continues: str | None = None  # partial rollouts: the cut episode it replays


def planned_episodes(batch: RolloutBatchInput) -> list[PlannedEpisode]:
    """Every episode of the batch in play order: the items' groups, then continuations."""
    return [
        PlannedEpisode(episode_id=f"{batch.batch_id}:{index}:{sample}", task_id=item.task_id,
                       seed=item.seed, group_id=f"{batch.batch_id}:{index}",
                       sample_index=sample)
        for index, item in enumerate(batch.items)
        for sample in range(item.group_size)
    ] + [
        PlannedEpisode(episode_id=continuation_episode_id(batch.batch_id, position, episode),
                       task_id=episode.task_id, seed=episode.seed, group_id=episode.group_id,
                       sample_index=episode.sample_index, continues=episode.prior_episode_id)
        for position, episode in enumerate(batch.continue_episodes)
    ]


def batch_plan(batch: RolloutBatchInput) -> dict[str, dict[str, Any]]:
    """The plan as ``rollout_batch.planned_episodes`` stores it: episode id -> task and seed."""
    return {e.episode_id: {"task_id": e.task_id, "seed": e.seed}
            for e in planned_episodes(batch)}


def planned_id(episode_id: str) -> str:
    """The planned episode an episode id stands for (a shadow stands for its production one)."""
    return episode_id.removesuffix(SHADOW_SUFFIX)
