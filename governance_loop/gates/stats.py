"""Small, deterministic statistics for gate decisions (standard library only).

No resampling: a bootstrap would need randomness, and these functions run inside
Temporal workflows and update validators, which must be deterministic. Normal
approximations are used throughout; every gate also requires a minimum sample
size, which is where those approximations become reasonable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist, fmean, stdev
from typing import Any


def evidence_number(value: float | None, digits: int = 6) -> float | None:
    """Round for evidence; non-finite values become None so evidence stays valid JSON."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def z_for(confidence: float) -> float:
    """Two-sided standard-normal quantile for a confidence level (0.95 -> 1.96)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


@dataclass(frozen=True)
class BinomialCounts:
    """Episodes and how many of them succeeded."""

    episodes: int
    successes: int

    def __post_init__(self) -> None:
        if not 0 <= self.successes <= self.episodes:
            raise ValueError(
                f"need 0 <= successes <= episodes, got {self.successes} of {self.episodes}"
            )

    @classmethod
    def from_outcomes(cls, outcomes: Iterable[bool]) -> BinomialCounts:
        """Count a sequence of episode successes."""
        flags = list(outcomes)
        return cls(episodes=len(flags), successes=sum(1 for f in flags if f))

    @property
    def rate(self) -> float:
        """Observed success rate; 0.0 when there are no episodes."""
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def exact_rate(self) -> Fraction:
        """The observed rate as a fraction, for comparisons a float rounding must not tip."""
        return Fraction(self.successes, self.episodes) if self.episodes else Fraction(0)

    @property
    def smoothed_rate(self) -> float:
        """Rate with one pseudo-success and one pseudo-failure, never exactly 0 or 1."""
        return (self.successes + 1) / (self.episodes + 2)


@dataclass(frozen=True)
class EpisodeStats:
    """Summary of one policy's episodes on one eval set."""

    episodes: int
    successes: int
    reward_mean: float
    # Sample standard deviation of episode reward (n - 1 denominator).
    reward_std: float

    def __post_init__(self) -> None:
        BinomialCounts(self.episodes, self.successes)  # validates the counts
        if not (math.isfinite(self.reward_mean) and math.isfinite(self.reward_std)):
            raise ValueError("reward_mean and reward_std must be finite")
        if self.reward_std < 0:
            raise ValueError(f"reward_std must be >= 0, got {self.reward_std}")

    @classmethod
    def from_outcomes(cls, successes: Sequence[bool], rewards: Sequence[float]) -> EpisodeStats:
        """Summarise per-episode outcomes; both sequences describe the same episodes."""
        if len(successes) != len(rewards):
            raise ValueError(f"{len(successes)} success flags but {len(rewards)} rewards")
        n = len(rewards)
        return cls(
            episodes=n,
            successes=sum(1 for s in successes if s),
            reward_mean=fmean(rewards) if n else 0.0,
            reward_std=stdev(rewards) if n >= 2 else 0.0,
        )

    @property
    def counts(self) -> BinomialCounts:
        """The success counts alone."""
        return BinomialCounts(self.episodes, self.successes)


@dataclass(frozen=True)
class Interval:
    """A point estimate with a confidence interval (bounds may be infinite)."""

    estimate: float
    low: float
    high: float
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; infinite bounds become None."""
        return {
            "estimate": evidence_number(self.estimate),
            "low": evidence_number(self.low),
            "high": evidence_number(self.high),
            "confidence": self.confidence,
        }


def wilson_interval(counts: BinomialCounts, confidence: float) -> Interval:
    """Wilson score interval for a success rate (well behaved near 0 and 1)."""
    n = counts.episodes
    if n == 0:
        return Interval(0.0, 0.0, 1.0, confidence)
    z = z_for(confidence)
    p = counts.rate
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), confidence)


def rate_difference(a: BinomialCounts, b: BinomialCounts, confidence: float) -> Interval:
    """Interval for rate(a) - rate(b), Agresti-Caffo (add one success and one failure)."""
    pa, pb = a.smoothed_rate, b.smoothed_rate
    se = math.sqrt(pa * (1 - pa) / (a.episodes + 2) + pb * (1 - pb) / (b.episodes + 2))
    z = z_for(confidence)
    centre = pa - pb
    return Interval(
        a.rate - b.rate, max(-1.0, centre - z * se), min(1.0, centre + z * se), confidence
    )


def rate_falls_by_more_than(a: BinomialCounts, b: BinomialCounts, tolerance: float) -> bool:
    """Whether rate(a) is more than ``tolerance`` below rate(b), computed exactly.

    The tolerance is read as the decimal a person wrote (0.05 is 1/20), so a drop of exactly
    the tolerance (19 of 20 against 20 of 20) is within it, as the threshold says.
    """
    return a.exact_rate - b.exact_rate < -Fraction(repr(tolerance))


def summary_mean_interval(mean: float, std: float, n: int, confidence: float) -> Interval:
    """Normal-approximation interval for a mean from its summary; unbounded when n < 2."""
    if n < 2:
        return Interval(mean, -math.inf, math.inf, confidence)
    half = z_for(confidence) * std / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, confidence)


def mean_interval(values: Sequence[float], confidence: float) -> Interval:
    """Normal-approximation interval for the mean of values; unbounded when fewer than two."""
    if len(values) < 2:
        return summary_mean_interval(fmean(values) if values else 0.0, 0.0, len(values),
                                     confidence)
    return summary_mean_interval(fmean(values), stdev(values), len(values), confidence)


def mean_difference(a: EpisodeStats, b: EpisodeStats, confidence: float) -> Interval:
    """Welch normal-approximation interval for mean_reward(a) - mean_reward(b)."""
    estimate = a.reward_mean - b.reward_mean
    if a.episodes < 2 or b.episodes < 2:
        return Interval(estimate, -math.inf, math.inf, confidence)
    se = math.sqrt(a.reward_std**2 / a.episodes + b.reward_std**2 / b.episodes)
    half = z_for(confidence) * se
    return Interval(estimate, estimate - half, estimate + half, confidence)


def _two_sided_p(z: float) -> float:
    return 2 * (1 - NormalDist().cdf(abs(z)))


def two_proportion_p_value(a: BinomialCounts, b: BinomialCounts) -> float:
    """Two-sided p-value of the pooled two-proportion z-test of rate(a) = rate(b).

    1.0 when either side is empty or both rates sit at the same bound (no variance to
    test against): no evidence of a difference."""
    if a.episodes == 0 or b.episodes == 0:
        return 1.0
    pooled = (a.successes + b.successes) / (a.episodes + b.episodes)
    se = math.sqrt(pooled * (1 - pooled) * (1 / a.episodes + 1 / b.episodes))
    if se == 0:
        return 1.0
    return _two_sided_p((a.rate - b.rate) / se)


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's z-test (normal approximation) of mean(a) = mean(b).

    1.0 with fewer than two values on a side; 0.0 when both sides are constant and differ
    (a difference without noise is certain)."""
    if len(a) < 2 or len(b) < 2:
        return 1.0
    difference = fmean(a) - fmean(b)
    se = math.sqrt(stdev(a) ** 2 / len(a) + stdev(b) ** 2 / len(b))
    if se == 0:
        return 1.0 if difference == 0 else 0.0
    return _two_sided_p(difference / se)
