"""Replay a stored episode and judge it: the functional core of the verifier.

Environments are deterministic given the task seed and the actions, so the stored actions,
applied in a fresh environment reset with the planned seed, reach the state the episode
reached; the contract's verifier then judges that state. The stored observations, rewards
and verdict are what the execution loop wrote and are not trusted: the replay recomputes the
step rewards, and ``outcome()`` runs the pinned verifier in its own process.

How a replay ends, in this order (as ``execution_loop.episode`` ends an episode):
- the environment raised while resetting or stepping: failed, no verdict asked for;
- a stored step follows the one where the environment said done: not this episode;
- the environment reported ``feedback["failure"]`` when it ended it: failed;
- otherwise the verifier's outcome. ``total_reward`` is the replayed step rewards plus the
  outcome reward (none for a failed episode).
Every judgement's ``details["terms"]`` splits ``total_reward`` by reward term, as the steps'
feedback and the outcome's details name them (``reward_terms``); reward left unnamed goes to
``process`` (steps) and to ``success`` or ``outcome`` (the outcome, as it succeeded or not).
The gates read the split to tell a gain in the task from a gain in shaping.
Lifecycle hooks are not re-run: they decide when an episode stops, not how it is judged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from execution_loop.environments.base import REWARD_TERMS, Environment, reset_task
from execution_loop.episode import INFRASTRUCTURE_ERRORS, act, contract_tools
from triloop.reward_terms import TASK_TERM, UNNAMED_OUTCOME, UNNAMED_PROCESS

# Rewards are sums of floats written through JSON and back: equal within this.
REWARD_TOLERANCE = 1e-6


def add_terms(terms: dict[str, float], named: Any, reward: float, *, unnamed: str) -> None:
    """Add one reward to ``terms``: the terms it names (a ``{term: value}`` mapping), and what
    they leave of ``reward`` to ``unnamed``, so ``terms`` always sums to the rewards added."""
    left = reward
    if isinstance(named, Mapping):
        for term, value in named.items():
            if isinstance(term, str) and isinstance(value, int | float) and math.isfinite(value):
                terms[term] = terms.get(term, 0.0) + float(value)
                left -= float(value)
    if abs(left) > REWARD_TOLERANCE:
        terms[unnamed] = terms.get(unnamed, 0.0) + left


@dataclass(frozen=True)
class Judged:
    """The verifier's judgement of one replayed episode."""

    success: bool
    total_reward: float
    details: dict[str, Any] = field(default_factory=dict)


def replay_and_judge(env: Environment, *, seed: int, actions: Sequence[str],
                     item: Mapping[str, Any] | None = None) -> Judged:
    """Reset ``env`` with ``seed`` (and the task's item), apply ``actions`` in order, and
    ask its verifier."""
    tools = contract_tools(env)
    step_rewards = 0.0
    terms: dict[str, float] = {}
    try:
        reset_task(env, seed, item)
        for index, action in enumerate(actions):
            result = act(env, action, tools)
            step_rewards += result.reward
            add_terms(terms, result.feedback.get(REWARD_TERMS), result.reward,
                      unnamed=UNNAMED_PROCESS)
            if not result.done:
                continue
            if index < len(actions) - 1:
                return Judged(False, step_rewards, {
                    "unverified": f"the environment ended the episode at turn {index}, but "
                                  f"{len(actions)} turns are stored", "terms": terms})
            failure = result.feedback.get("failure")
            if isinstance(failure, str) and failure:
                return Judged(False, step_rewards, {"failed": failure, "terms": terms})
        outcome = env.outcome()
    except INFRASTRUCTURE_ERRORS:
        raise  # the verifier's machinery failed: try again later, never a verdict
    except Exception as exc:
        return Judged(False, step_rewards,
                      {"failed": f"replay raised {type(exc).__name__}: {exc}"[:500],
                       "terms": terms})
    add_terms(terms, outcome.details.get(REWARD_TERMS), outcome.reward,
              unnamed=TASK_TERM if outcome.success else UNNAMED_OUTCOME)
    return Judged(outcome.success, step_rewards + outcome.reward,
                  {"verifier": outcome.details, "turns": len(actions), "terms": terms})


def agrees(judged: Judged, *, success: bool, total_reward: float) -> bool:
    """Whether the execution loop's own row said what the verifier says."""
    return judged.success == success and math.isclose(
        judged.total_reward, total_reward, rel_tol=REWARD_TOLERANCE, abs_tol=REWARD_TOLERANCE)
