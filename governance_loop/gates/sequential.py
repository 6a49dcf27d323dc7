"""Canary and watch: always-valid sequential tests on success rate and mean reward.

Each metric is tested with the one-sided normal-mixture SPRT of
``gates.always_valid`` on the candidate's shortfall against a reference (a
positive shortfall means the candidate is worse). Decisions are a function of
the cumulative counts alone and stay valid however often the workflow looks.

Canary (alpha = false_abort_rate, beta = missed_regression_rate, delta =
regression_to_detect; the same for reward with reward_regression_to_detect):

* regression test, null "shortfall <= 0": abort (restore routing) as soon as its
  evidence reaches ln(k/alpha) on any of the k metrics;
* safety test, null "shortfall >= delta": the candidate is shown not worse by
  delta once its evidence reaches ln(1/beta). Pass needs this on every metric, and
  only once the soak is complete: the soak is a minimum exposure.

At soak end without a pass the canary fails (restoring routing): undecided, or
without enough information. No look decides before ``min_samples_per_arm``
episodes per arm, nor on degenerate data (fewer than five successes or failures
across both arms, or constant rewards): it continues, "not enough information".

Watch (alpha = false_rollback_rate): the regression test of the promoted model
against each pre-promotion baseline, for success rate (null "shortfall <= 0") and,
if ``max_reward_regression`` is set, mean reward (null "drop <= that tolerance").
alpha is split over every (baseline, metric) test; any crossing rolls back. At
the end of the watch period without one, the watch passes.

The sample size is planned from the effect, alpha and beta
(``always_valid.planned_information``) and reported in the evidence of each look
with the information gathered so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from governance_loop.gates.always_valid import (
    MIN_EVENTS,
    FloatArray,
    evidence_boundary,
    log_mixture_evidence,
    planned_information,
    pooled_mean_information,
    pooled_rate_information,
)
from governance_loop.gates.stats import BinomialCounts, evidence_number

TEST_NAME = "one-sided normal-mixture SPRT (always valid)"
SUCCESS_RATE = "success rate"
MEAN_REWARD = "mean reward"


@dataclass(frozen=True)
class RewardSummary:
    """Mean and (sample) variance of episode rewards over ``episodes`` episodes."""

    episodes: int
    mean: float
    variance: float


@dataclass(frozen=True)
class MetricTest:
    """One metric's tests at one look (scalars in a gate, arrays in a simulation)."""

    metric: str
    # Candidate's shortfall against the reference (fraction or reward units).
    shortfall: FloatArray
    # 1 / variance of the shortfall estimate.
    information: FloatArray
    # No information to decide on: the tests below are 0 and may not decide.
    degenerate: Any
    # ln M of "the shortfall exceeds the tolerance" (rejects the null of no regression).
    log_regressed: FloatArray
    # ln M of "the shortfall is below the tolerance + effect" (rejects the null of regression).
    log_not_worse: FloatArray
    # The effect the test is built to detect (the mixture scale), and the tolerance.
    effect: float
    tolerance: float
    # Pooled per-episode variance, for turning planned information into episodes.
    unit_variance: FloatArray


def metric_test(
    metric: str, shortfall: FloatArray, information: FloatArray, degenerate: Any,
    unit_variance: FloatArray, *, effect: float, tolerance: float = 0.0,
) -> MetricTest:
    """Both one-sided tests of one metric; degenerate entries carry no evidence."""
    regressed = log_mixture_evidence(information * (shortfall - tolerance), information, effect)
    not_worse = log_mixture_evidence(
        information * (tolerance + effect - shortfall), information, effect)
    return MetricTest(
        metric=metric, shortfall=shortfall, information=information, degenerate=degenerate,
        log_regressed=np.where(degenerate, 0.0, regressed),
        log_not_worse=np.where(degenerate, 0.0, not_worse),
        effect=effect, tolerance=tolerance, unit_variance=unit_variance,
    )


def rate_test(reference: tuple[Any, Any], candidate: tuple[Any, Any], effect: float
              ) -> MetricTest:
    """Success-rate tests from (episodes, successes) of the reference and the candidate."""
    shortfall, information, degenerate = pooled_rate_information(*reference, *candidate)
    total = np.asarray(reference[0], dtype=np.float64) + candidate[0]
    pooled = (np.asarray(reference[1], dtype=np.float64) + candidate[1]) / np.maximum(total, 1)
    return metric_test(SUCCESS_RATE, shortfall, information, degenerate,
                       pooled * (1 - pooled), effect=effect)


def reward_test(reference: tuple[Any, Any, Any], candidate: tuple[Any, Any, Any], *,
                effect: float, tolerance: float = 0.0) -> MetricTest:
    """Mean-reward tests from (episodes, mean, sample variance) of reference and candidate."""
    shortfall, information, degenerate = pooled_mean_information(*reference, *candidate)
    n = (1 / np.maximum(np.asarray(reference[0], dtype=np.float64), 1)
         + 1 / np.maximum(np.asarray(candidate[0], dtype=np.float64), 1))
    unit = np.where(degenerate, 0.0, 1 / (np.where(degenerate, 1.0, information) * n))
    return metric_test(MEAN_REWARD, shortfall, information, degenerate, unit,
                       effect=effect, tolerance=tolerance)


def reward_numbers(summary: RewardSummary | None) -> tuple[int, float, float]:
    """(episodes, mean, variance); no summary counts as no episodes (degenerate)."""
    if summary is None:
        return (0, 0.0, 0.0)
    return (summary.episodes, summary.mean, summary.variance)


@lru_cache(maxsize=256)
def planned_information_for(effect: float, alpha: float, beta: float, *, two_sided: bool
                            ) -> float:
    """Information to detect ``effect`` with power 1 - beta at level alpha (cached).

    With ``two_sided`` the plan also lets an equal candidate show it is not worse by
    ``effect`` with power 1 - alpha at level beta (the canary's pass); the larger wins.
    """
    regressed = planned_information(effect, effect, alpha, 1 - beta)
    if not two_sided:
        return regressed
    return max(regressed, planned_information(effect, effect, beta, 1 - alpha))


def planned_episodes_per_arm(test: MetricTest, information: float) -> int | None:
    """Episodes per arm, with equal arms at the pooled variance, that reach ``information``."""
    unit = float(test.unit_variance)
    if bool(test.degenerate) or unit <= 0:
        return None
    return math.ceil(2 * unit * information)


def describe(test: MetricTest) -> str:
    """The shortfall in words: points for success rate, reward units for reward."""
    value = float(test.shortfall)
    if test.metric == SUCCESS_RATE:
        return f"success rate shortfall {value * 100:+.1f} points"
    return f"mean reward shortfall {value:+.4g}"


def effect_words(test: MetricTest) -> str:
    """The effect the test detects, in the metric's units."""
    if test.metric == SUCCESS_RATE:
        return f"{test.effect * 100:.3g} points"
    return f"{test.effect:.4g} reward"


def metric_evidence(test: MetricTest, *, planned: float, regressed_at: float,
                  not_worse_at: float | None) -> dict[str, Any]:
    """JSON-ready numbers of one metric's tests at one look."""
    evidence: dict[str, Any] = {
        "metric": test.metric,
        "test": TEST_NAME,
        "degenerate": bool(test.degenerate),
        "shortfall": evidence_number(float(test.shortfall)),
        "effect_to_detect": test.effect,
        "tolerance": test.tolerance,
        "information": evidence_number(float(test.information)),
        "planned_information": evidence_number(planned),
        "information_fraction": evidence_number(float(test.information) / planned),
        "planned_episodes_per_arm": planned_episodes_per_arm(test, planned),
        "log_evidence_regressed": evidence_number(float(test.log_regressed)),
        "regressed_boundary": evidence_number(regressed_at),
    }
    if not_worse_at is not None:
        evidence["log_evidence_not_worse"] = evidence_number(float(test.log_not_worse))
        evidence["not_worse_boundary"] = evidence_number(not_worse_at)
    return evidence


def not_enough_information(test: MetricTest, counts: tuple[BinomialCounts, ...]) -> str:
    """Why a degenerate metric cannot decide."""
    if test.metric == SUCCESS_RATE:
        episodes = sum(c.episodes for c in counts)
        successes = sum(c.successes for c in counts)
        return (f"{test.metric}: {successes} successes in {episodes} episodes across both "
                f"arms; the test needs at least {MIN_EVENTS} successes and {MIN_EVENTS} "
                "failures")
    return f"{test.metric}: rewards have no variance (or an arm has fewer than 2 episodes)"


def alpha_boundary(alpha: float, tests: int) -> float:
    """Evidence boundary of one of ``tests`` tests sharing alpha (Bonferroni)."""
    return evidence_boundary(alpha / tests)


def arm_evidence(counts: BinomialCounts, reward: RewardSummary | None) -> dict[str, Any]:
    """One arm's counts (and reward summary) for the evidence."""
    arm: dict[str, Any] = {
        "episodes": counts.episodes,
        "successes": counts.successes,
        "success_rate": evidence_number(counts.rate),
    }
    if reward is not None:
        arm["reward_mean"] = evidence_number(reward.mean)
        arm["reward_variance"] = evidence_number(reward.variance)
    return arm
