"""Configurable asynchrony, as pure rules: how far rollouts run ahead, what a cut episode is.

**Staleness window.** Iteration k's update trains policy version k from c_{k-1}. With
``asynchrony.staleness_window`` = w, the workflow keeps the rollouts of up to w later
iterations in flight, each sampled with the newest checkpoint there is when it starts; so
a batch is at most w policy versions old when its update runs. The update's off-policy
guard (``update.max_staleness``, ``update.stale_samples``: drop, or decoupled-PPO
importance correction) handles what is older than it allows. w = 1 is the one-step
overlap the workflow always had.

**Truncated episodes.** An episode the *clock* cut (the batch deadline, the episode's own
deadline, the contract's wall time) did not fail: it ran out of time, and slow episodes
run out first. Training on its partial reward as if it had finished teaches "finish
fast", a bias against long-horizon tasks. An episode the *horizon* ended (``max_turns``,
``max_total_tokens``, ``context_length``) hit the environment's own budget, which is part
of the task. The rule (``asynchrony.truncated_episodes``):

- ``exclude_clock`` (default): clock-cut episodes are left out, horizon-ended ones train;
  a truncated episode without a recognised horizon reason counts as clock-cut;
- ``exclude_all``: every truncated episode is left out;
- ``train``: all train on what they got (the behaviour before issue 18).

A left-out episode is in neither its group's baseline nor the loss nor the reward
metrics; it is counted (``batch.truncated_excluded``). Pure python.
"""

from __future__ import annotations

from typing import Literal

from triloop.statuses import EpisodeStatus

HORIZON_REASONS = frozenset({"max_turns", "max_total_tokens", "context_length"})
TruncationRule = Literal["exclude_clock", "exclude_all", "train"]


def learns_from(status: str, failure_reason: str | None, rule: TruncationRule) -> bool:
    """Whether a completed or truncated episode trains under ``rule``."""
    if status != EpisodeStatus.TRUNCATED or rule == "train":
        return True
    if rule == "exclude_all":
        return False
    return failure_reason in HORIZON_REASONS


def rollouts_to_start(*, next_iteration: int, in_flight: int, window: int,
                      last_iteration: int) -> list[int]:
    """Iterations whose rollouts to start now so that ``window`` run ahead of the update.

    ``next_iteration`` is the first iteration without a rollout; ``last_iteration`` the
    last one this workflow run may start (the run's end, or the continue-as-new point).
    """
    room = max(0, window - in_flight)
    return list(range(next_iteration, min(next_iteration + room, last_iteration + 1)))
