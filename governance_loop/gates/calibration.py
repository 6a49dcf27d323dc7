"""Simulated error rates of the canary and watch rules, vectorised over scenarios.

Each scenario draws episodes look by look from known success rates (and, if
asked, normal rewards), feeds the cumulative numbers of every look to the same
``canary_verdict_codes`` / ``watch_verdict_codes`` the gates use, and stops at
the first final verdict. Randomness comes only from the ``numpy`` generator the
caller seeds. Used by ``tests/unit/test_gate_calibration.py`` and
``bench/gate_calibration.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from governance_loop.gates.canary import (
    ABORT,
    CONTINUE,
    FAIL,
    PASS,
    canary_tests,
    canary_verdict_codes,
)
from governance_loop.gates.sequential import planned_information_for
from governance_loop.gates.thresholds import CanarySpec, WatchSpec
from governance_loop.gates.watch import (
    ROLLBACK,
    tests_per_baseline,
    watch_tests,
    watch_verdict_codes,
)


@dataclass(frozen=True)
class Rewards:
    """Normal episode rewards: the reference arm's mean and sd, and the candidate's drop."""

    mean: float = 0.5
    sd: float = 0.25
    # How much lower the candidate's (or promoted model's) mean reward is.
    drop: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """Fractions of scenarios by final verdict, and the mean episodes per arm at the end."""

    scenarios: int
    rates: dict[str, float]
    mean_episodes: float

    def standard_error(self, rate: float) -> float:
        """Monte-Carlo standard error of a rate estimated from these scenarios."""
        return math.sqrt(max(rate * (1 - rate), 1e-12) / self.scenarios)


def _successes(rng: np.random.Generator, rate: float, per_look: int, shape: tuple[int, int]
               ) -> np.ndarray:
    return np.cumsum(rng.binomial(per_look, rate, size=shape), axis=1)


def _rewards(rng: np.random.Generator, mean: float, sd: float, per_look: int,
             shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cumulative (episodes, mean, sample variance) of normal rewards at every look."""
    draws = rng.normal(mean, sd, size=(*shape, per_look))
    sums = np.cumsum(draws.sum(axis=2), axis=1)
    squares = np.cumsum((draws * draws).sum(axis=2), axis=1)
    n = per_look * np.arange(1, shape[1] + 1, dtype=np.float64)
    mean_so_far = sums / n
    variance = np.maximum(squares - n * mean_so_far**2, 0.0) / np.maximum(n - 1, 1)
    return np.broadcast_to(n, shape), mean_so_far, variance


def _first_final(codes: np.ndarray) -> np.ndarray:
    """Index of each scenario's first non-continue look (the last look is always final)."""
    final = codes != CONTINUE
    return np.asarray(final.argmax(axis=1))


def simulate_canary(
    spec: CanarySpec, *, rng: np.random.Generator, scenarios: int, looks: int,
    production_rate: float, canary_rate: float, per_look: tuple[int, int],
    rewards: Rewards | None = None,
) -> Outcome:
    """Run the canary rule; ``per_look`` is (production, canary) episodes between looks."""
    shape = (scenarios, looks)
    n_p = per_look[0] * np.arange(1, looks + 1)
    n_c = per_look[1] * np.arange(1, looks + 1)
    s_p = _successes(rng, production_rate, per_look[0], shape)
    s_c = _successes(rng, canary_rate, per_look[1], shape)
    production_reward = canary_reward = None
    if rewards is not None:
        production_reward = _rewards(rng, rewards.mean, rewards.sd, per_look[0], shape)
        canary_reward = _rewards(rng, rewards.mean - rewards.drop, rewards.sd, per_look[1],
                                 shape)
    tests = canary_tests((n_p, s_p), (n_c, s_c), spec, production_reward, canary_reward)
    soak_complete = np.arange(looks) == looks - 1
    codes = canary_verdict_codes(tests, np.minimum(n_p, n_c), soak_complete, spec)
    end = _first_final(codes)
    verdicts = codes[np.arange(scenarios), end]
    names = {ABORT: "abort", PASS: "pass", FAIL: "fail"}
    return Outcome(
        scenarios=scenarios,
        rates={name: float(np.mean(verdicts == code)) for code, name in names.items()},
        mean_episodes=float(np.mean(np.minimum(n_p, n_c)[end])),
    )


def simulate_watch(
    spec: WatchSpec, *, rng: np.random.Generator, scenarios: int, looks: int,
    baselines: tuple[tuple[int, float], ...], promoted_rate: float, per_look: int,
    rewards: Rewards | None = None,
) -> Outcome:
    """Run the watch rule against fixed baselines of (episodes, success rate) each."""
    shape = (scenarios, looks)
    n_p = per_look * np.arange(1, looks + 1)
    s_p = _successes(rng, promoted_rate, per_look, shape)
    promoted_reward = None
    if rewards is not None:
        promoted_reward = _rewards(rng, rewards.mean - rewards.drop, rewards.sd, per_look, shape)
    sharing = len(baselines) * tests_per_baseline(spec)
    period_complete = np.arange(looks) == looks - 1
    rollback = np.zeros(shape, dtype=bool)
    for episodes, rate in baselines:
        s_b = rng.binomial(episodes, rate, size=(scenarios, 1))
        baseline_reward = None
        if rewards is not None:
            draws = rng.normal(rewards.mean, rewards.sd, size=(scenarios, episodes))
            baseline_reward = (episodes, draws.mean(axis=1, keepdims=True),
                               draws.var(axis=1, ddof=1, keepdims=True))
        tests = watch_tests((episodes, s_b), (n_p, s_p), spec, baseline_reward, promoted_reward)
        codes = watch_verdict_codes(tests, n_p, period_complete, spec,
                                    tests_sharing_alpha=sharing)
        rollback |= codes == ROLLBACK
    rolled = rollback.any(axis=1)
    end = np.where(rolled, rollback.argmax(axis=1), looks - 1)
    return Outcome(
        scenarios=scenarios,
        rates={"rollback": float(np.mean(rolled)), "pass": float(np.mean(~rolled))},
        mean_episodes=float(np.mean(n_p[end])),
    )


def planned_canary_episodes(spec: CanarySpec, rate: float, production_per_canary: float = 1.0
                            ) -> int:
    """Canary episodes the plan needs at this success rate, with this many production
    episodes per canary episode (1: equal arms, the per-arm plan the evidence reports)."""
    tests = 1 if spec.reward_regression_to_detect is None else 2
    info = planned_information_for(spec.regression_to_detect, spec.false_abort_rate / tests,
                                   spec.missed_regression_rate, two_sided=True)
    return math.ceil(rate * (1 - rate) * info * (1 + 1 / production_per_canary))


def planned_watch_episodes(spec: WatchSpec, rate: float, baselines: int,
                           baseline_episodes: int) -> int | None:
    """Promoted episodes the watch plan needs against a baseline of this size; None if never."""
    sharing = baselines * tests_per_baseline(spec)
    info = planned_information_for(spec.regression_to_detect,
                                   spec.false_rollback_rate / sharing,
                                   spec.missed_regression_rate, two_sided=False)
    spare = 1 / (rate * (1 - rate) * info) - 1 / baseline_episodes
    return math.ceil(1 / spare) if spare > 0 else None
