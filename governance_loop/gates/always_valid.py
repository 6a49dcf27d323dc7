"""Always-valid one-sided tests: a normal-mixture SPRT in information time.

At a look, an effect estimate ``D`` (how far the candidate falls short of the
reference) has variance ``v``; the information is ``I = 1/v``. For a null
"shortfall <= theta0" the score is ``S = I * (D - theta0)``. To the normal
approximation, S at successive looks is a Brownian motion in I with drift
``I * (shortfall - theta0)``, however the looks are spaced and whatever the
allocation between arms (the canonical joint distribution of group-sequential
designs, Jennison & Turnbull 2000, ch. 3). So the likelihood ratio of drift
``theta`` against none is ``exp(theta * S - theta^2 * I / 2)``. Mixing it over a
half-normal prior on ``theta >= 0`` with scale ``tau``::

    M = 2 / sqrt(1 + tau^2 I) * exp(S^2 / 2a) * Phi(S / sqrt(a)),    a = I + 1/tau^2

gives a non-negative supermartingale with M = 1 at I = 0 under the null, and by
Ville's inequality P(M ever >= 1/alpha) <= alpha: the test may look after every
episode, or once a day, without inflating alpha. This is the mixture SPRT
(Robbins 1970; Johari, Pekelis & Walsh 2017, "always valid p-values"), made
one-sided by the half-normal prior. ``tau`` is set to the effect the threshold
means to detect, where the mixture is most powerful.

Departures: the variance is a plug-in estimate from the pooled sample, so validity
is asymptotic; data with no variance (all failures, all successes, constant
rewards) has no information and is reported as degenerate, never plugged in.

Written by hand because no library we depend on provides the mixture SPRT;
scipy supplies the normal distribution, the root finding and the quantiles.
Everything here is vectorised over numpy arrays so that the same functions make
one decision in a gate and a million in a calibration simulation.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize, stats

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

# The normal approximation of a difference in success rates needs some of each outcome;
# the textbook rule is at least five successes and five failures (here across both arms).
MIN_EVENTS = 5


def log_mixture_evidence(score: ArrayLike, information: ArrayLike, scale: float) -> FloatArray:
    """ln M of the one-sided normal-mixture SPRT (see the module docstring); 0 at I = 0."""
    s = np.asarray(score, dtype=np.float64)
    i = np.asarray(information, dtype=np.float64)
    a = i + 1.0 / scale**2
    root = np.sqrt(a)
    result: FloatArray = (
        math.log(2.0) - 0.5 * np.log1p(scale**2 * i) + s * s / (2.0 * a)
        + stats.norm.logcdf(s / root)
    )
    return result


def evidence_boundary(level: float) -> float:
    """The value of ln M at which the test rejects at this error rate: ln(1/level)."""
    return -math.log(level)


def score_boundary(information: float, scale: float, level: float) -> float:
    """The score S at which ln M reaches ln(1/level) at this information (S grows with M)."""
    target = evidence_boundary(level)

    def gap(score: float) -> float:
        return float(log_mixture_evidence(score, information, scale)) - target

    high = 1.0
    while gap(high) < 0:
        high *= 2.0
    return float(optimize.brentq(gap, -1.0 if gap(-1.0) < 0 else -1e6, high, xtol=1e-9))


def planned_information(effect: float, scale: float, level: float, power: float) -> float:
    """Information at which a true effect crosses the level-``level`` boundary w.p. >= power.

    Solves ``effect * I - boundary(I) = z_power * sqrt(I)``: the score's mean reaches
    the boundary plus ``z_power`` standard deviations at that look alone. Crossings at
    earlier looks only add to the power, so the plan errs on the long side.
    """
    z = float(stats.norm.ppf(power))

    def margin(log_info: float) -> float:
        info = math.exp(log_info)
        return effect * info - score_boundary(info, scale, level) - z * math.sqrt(info)

    return math.exp(float(optimize.brentq(margin, math.log(1e-6 / effect**2),
                                          math.log(1e9 / effect**2), xtol=1e-9)))


def pooled_rate_information(
    reference_episodes: ArrayLike, reference_successes: ArrayLike,
    candidate_episodes: ArrayLike, candidate_successes: ArrayLike,
) -> tuple[FloatArray, FloatArray, BoolArray]:
    """(shortfall p_ref - p_cand, information, degenerate) for two success counts.

    The variance of the difference uses the pooled rate, p(1-p)(1/n_ref + 1/n_cand):
    the variance under "no difference", and never smaller than the unpooled one when
    the arms are of equal size. Fewer than ``MIN_EVENTS`` successes or failures in
    the pooled sample is degenerate: there is no information to decide on.
    """
    nr = np.asarray(reference_episodes, dtype=np.float64)
    sr = np.asarray(reference_successes, dtype=np.float64)
    nc = np.asarray(candidate_episodes, dtype=np.float64)
    sc = np.asarray(candidate_successes, dtype=np.float64)
    total = nr + nc
    wins = sr + sc
    degenerate = (nr < 1) | (nc < 1) | (wins < MIN_EVENTS) | (total - wins < MIN_EVENTS)
    with np.errstate(divide="ignore", invalid="ignore"):
        shortfall = np.where(degenerate, 0.0, sr / np.maximum(nr, 1) - sc / np.maximum(nc, 1))
        pooled = wins / np.maximum(total, 1)
        variance = pooled * (1 - pooled) * (1 / np.maximum(nr, 1) + 1 / np.maximum(nc, 1))
        information = np.where(degenerate, 0.0, 1 / np.where(degenerate, 1.0, variance))
    return shortfall, information, degenerate


def pooled_mean_information(
    reference_episodes: ArrayLike, reference_mean: ArrayLike, reference_variance: ArrayLike,
    candidate_episodes: ArrayLike, candidate_mean: ArrayLike, candidate_variance: ArrayLike,
) -> tuple[FloatArray, FloatArray, BoolArray]:
    """(shortfall mean_ref - mean_cand, information, degenerate) from two reward summaries.

    Variances are sample variances (n - 1). The variance of the difference uses the
    variance of the pooled sample, s^2 (1/n_ref + 1/n_cand), as for success rates;
    a pooled sample whose rewards are all equal (or an arm with fewer than two
    episodes) is degenerate.
    """
    nr = np.asarray(reference_episodes, dtype=np.float64)
    mr = np.asarray(reference_mean, dtype=np.float64)
    vr = np.asarray(reference_variance, dtype=np.float64)
    nc = np.asarray(candidate_episodes, dtype=np.float64)
    mc = np.asarray(candidate_mean, dtype=np.float64)
    vc = np.asarray(candidate_variance, dtype=np.float64)
    total = nr + nc
    grand = (nr * mr + nc * mc) / np.maximum(total, 1)
    squares = (np.maximum(nr - 1, 0) * vr + np.maximum(nc - 1, 0) * vc
               + nr * (mr - grand) ** 2 + nc * (mc - grand) ** 2)
    pooled = squares / np.maximum(total - 1, 1)
    # Relative tolerance: rounding leaves a tiny positive variance on constant rewards.
    flat = pooled <= 1e-12 * (1.0 + grand * grand)
    degenerate = (nr < 2) | (nc < 2) | flat
    variance = np.where(degenerate, 1.0, pooled * (1 / np.maximum(nr, 1) + 1 / np.maximum(nc, 1)))
    shortfall = np.where(degenerate, 0.0, mr - mc)
    information = np.where(degenerate, 0.0, 1 / variance)
    return shortfall, information, degenerate
