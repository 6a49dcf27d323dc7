"""Canary and watch: sequential regression tests on episode success rates.

Both use the log-likelihood ratio of H1 "candidate is worse by delta" against
H0 "no regression", from a normal approximation of the difference in observed
success rates (see ``stats.regression_log_likelihood_ratio``). Decisions are a
function of the cumulative counts alone, so the workflow may look as often as
it likes without keeping test state.

Canary (Wald SPRT, alpha = false_abort_rate, beta = missed_regression_rate):
no decision before ``min_samples_per_arm`` episodes in each arm; then abort as
soon as LLR >= ln((1-beta)/alpha); at the end of the soak pass iff
LLR <= ln(beta/(1-alpha)), otherwise fail as undecided. Both aborts and fails
restore routing. Ville's inequality bounds the false-abort rate under
continuous monitoring by alpha/(1-beta); a final LR below beta/(1-alpha)
happens under H1 with probability at most beta/(1-alpha).

Watch (open-ended one-sided SPRT): roll back as soon as the promoted model has
``min_samples`` episodes and LLR >= ln(1/alpha) against the pre-promotion
baseline; at the end of the watch period without that, pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from governance_loop.gates.decision import CANARY, WATCH, GateDecision, Verdict
from governance_loop.gates.stats import (
    BinomialCounts,
    RegressionLikelihood,
    evidence_number,
    rate_difference,
    regression_log_likelihood_ratio,
)
from governance_loop.gates.thresholds import ThresholdSpec


@dataclass(frozen=True)
class CanaryObservation:
    """Cumulative canary outcomes so far, both arms over the same period."""

    canary: BinomialCounts
    production: BinomialCounts
    # True at the last look, when the soak timer has fired.
    soak_complete: bool


@dataclass(frozen=True)
class WatchObservation:
    """Outcomes of the promoted model against the pre-promotion baseline."""

    baseline: BinomialCounts
    promoted: BinomialCounts
    # True at the last look, when the watch period has ended.
    period_complete: bool
    baseline_reward: RewardSummary | None = None
    promoted_reward: RewardSummary | None = None


@dataclass(frozen=True)
class RewardSummary:
    """Mean and (sample) variance of episode rewards over ``episodes`` episodes."""

    episodes: int
    mean: float
    variance: float


def reward_regression(
    baseline: RewardSummary, promoted: RewardSummary, *, tolerance: float, alpha: float
) -> tuple[bool, dict[str, Any]]:
    """Whether mean reward fell by more than ``tolerance``, on a one-sided (1 - alpha) bound."""
    drop = baseline.mean - promoted.mean
    stderr = math.sqrt(
        baseline.variance / baseline.episodes + promoted.variance / promoted.episodes
    )
    lower = drop - NormalDist().inv_cdf(1 - alpha) * stderr
    return lower > tolerance, {
        "baseline_reward_mean": evidence_number(baseline.mean),
        "promoted_reward_mean": evidence_number(promoted.mean),
        "reward_drop": evidence_number(drop),
        "reward_drop_lower_bound": evidence_number(lower),
        "max_reward_regression": tolerance,
    }


def _arm(counts: BinomialCounts) -> dict[str, Any]:
    return {
        "episodes": counts.episodes,
        "successes": counts.successes,
        "success_rate": evidence_number(counts.rate),
    }


def _test_evidence(
    test: RegressionLikelihood,
    candidate: BinomialCounts,
    reference: BinomialCounts,
    confidence: float,
) -> dict[str, Any]:
    return {
        "log_likelihood_ratio": evidence_number(test.llr),
        "success_rate_delta": rate_difference(candidate, reference, confidence).to_dict(),
    }


def decide_canary(observation: CanaryObservation, thresholds: ThresholdSpec) -> GateDecision:
    """Continue, abort on regression, or pass the canary from cumulative counts."""
    spec = thresholds.canary
    version = thresholds.version
    canary, production = observation.canary, observation.production
    abort_at = math.log((1 - spec.missed_regression_rate) / spec.false_abort_rate)
    pass_at = math.log(spec.missed_regression_rate / (1 - spec.false_abort_rate))
    evidence: dict[str, Any] = {
        "threshold_version": version,
        "thresholds": {
            "min_samples_per_arm": spec.min_samples_per_arm,
            "regression_to_detect": spec.regression_to_detect,
            "false_abort_rate": spec.false_abort_rate,
            "missed_regression_rate": spec.missed_regression_rate,
        },
        "canary": _arm(canary),
        "production": _arm(production),
        "abort_boundary": evidence_number(abort_at),
        "pass_boundary": evidence_number(pass_at),
        "soak_complete": observation.soak_complete,
    }

    def decision(verdict: Verdict, reason: str) -> GateDecision:
        return GateDecision(
            gate=CANARY,
            passed=verdict is Verdict.PASS,
            reasons=[f"{reason} (thresholds {version})"],
            evidence=evidence,
            verdict=verdict,
            restore_routing=verdict in (Verdict.ABORT_REGRESSION, Verdict.FAIL),
        )

    fewest = min(canary.episodes, production.episodes)
    if fewest < spec.min_samples_per_arm:
        evidence["log_likelihood_ratio"] = None
        shortfall = (
            f"canary {canary.episodes} and production {production.episodes} episodes; "
            f"min_samples_per_arm is {spec.min_samples_per_arm}"
        )
        if observation.soak_complete:
            return decision(Verdict.FAIL, f"soak ended with too few episodes: {shortfall}")
        return decision(Verdict.CONTINUE, f"waiting for the minimum sample: {shortfall}")

    test = regression_log_likelihood_ratio(canary, production, spec.regression_to_detect)
    evidence.update(_test_evidence(test, canary, production, thresholds.confidence))
    llr = f"LLR {test.llr:.3f}"
    delta = f"success rate delta {test.rate_difference * 100:+.1f} points"
    if test.llr >= abort_at:
        return decision(
            Verdict.ABORT_REGRESSION,
            f"canary regressed: {delta}, {llr} >= abort boundary {abort_at:.3f}",
        )
    if not observation.soak_complete:
        return decision(Verdict.CONTINUE, f"soak in progress: {delta}, {llr}")
    if test.llr <= pass_at:
        return decision(
            Verdict.PASS, f"no regression: {delta}, {llr} <= pass boundary {pass_at:.3f}"
        )
    return decision(
        Verdict.FAIL,
        f"soak ended undecided: {delta}, {llr} between pass boundary {pass_at:.3f} and "
        f"abort boundary {abort_at:.3f}; extend the soak or raise the canary share",
    )


def decide_watch(observation: WatchObservation, thresholds: ThresholdSpec) -> GateDecision:
    """Roll back on a regression against the pre-promotion baseline, else keep watching."""
    spec = thresholds.watch
    version = thresholds.version
    baseline, promoted = observation.baseline, observation.promoted
    rollback_at = math.log(1 / spec.false_rollback_rate)
    evidence: dict[str, Any] = {
        "threshold_version": version,
        "thresholds": {
            "min_samples": spec.min_samples,
            "regression_to_detect": spec.regression_to_detect,
            "false_rollback_rate": spec.false_rollback_rate,
        },
        "baseline": _arm(baseline),
        "promoted": _arm(promoted),
        "rollback_boundary": evidence_number(rollback_at),
        "period_complete": observation.period_complete,
        "log_likelihood_ratio": None,
    }
    verdict = Verdict.PASS if observation.period_complete else Verdict.CONTINUE
    if promoted.episodes < spec.min_samples or baseline.episodes == 0:
        reason = (
            f"promoted model has {promoted.episodes} episodes and the baseline "
            f"{baseline.episodes}; min_samples is {spec.min_samples}, no rollback evidence"
        )
    else:
        test = regression_log_likelihood_ratio(promoted, baseline, spec.regression_to_detect)
        evidence.update(_test_evidence(test, promoted, baseline, thresholds.confidence))
        delta = f"success rate delta {test.rate_difference * 100:+.1f} points vs baseline"
        if test.llr >= rollback_at:
            verdict = Verdict.ROLLBACK
            reason = f"regression after promotion: {delta}, LLR {test.llr:.3f} >= {rollback_at:.3f}"
        else:
            reason = f"no regression detected: {delta}, LLR {test.llr:.3f} < {rollback_at:.3f}"
        rewards = (observation.baseline_reward, observation.promoted_reward)
        if (verdict is not Verdict.ROLLBACK and spec.max_reward_regression is not None
                and rewards[0] is not None and rewards[1] is not None
                and rewards[0].episodes >= 2 and rewards[1].episodes >= 2):
            regressed, reward_evidence = reward_regression(
                rewards[0], rewards[1], tolerance=spec.max_reward_regression,
                alpha=spec.false_rollback_rate,
            )
            evidence.update(reward_evidence)
            if regressed:
                verdict = Verdict.ROLLBACK
                reason = (
                    f"regression after promotion: mean reward fell by "
                    f"{reward_evidence['reward_drop']:.3f} (lower bound "
                    f"{reward_evidence['reward_drop_lower_bound']:.3f} > tolerance "
                    f"{spec.max_reward_regression}); {delta}"
                )
    return GateDecision(
        gate=WATCH,
        passed=verdict is Verdict.PASS,
        reasons=[f"{reason} (thresholds {version})"],
        evidence=evidence,
        verdict=verdict,
        rollback=verdict is Verdict.ROLLBACK,
    )


def decide_watch_against_baselines(
    baselines: Mapping[str, BinomialCounts],
    promoted: BinomialCounts,
    *,
    period_complete: bool,
    thresholds: ThresholdSpec,
    rewards: Mapping[str, RewardSummary] | None = None,
    promoted_reward: RewardSummary | None = None,
) -> GateDecision:
    """Watch against every pre-promotion baseline; the first regression rolls back.

    Two baselines exist before a promotion: the model production served, and the
    candidate itself during its canary (the evidence it was promoted on). A model
    that falls below either after promotion has regressed.
    """
    decisions = {
        name: decide_watch(
            WatchObservation(
                baseline=counts, promoted=promoted, period_complete=period_complete,
                baseline_reward=(rewards or {}).get(name), promoted_reward=promoted_reward,
            ),
            thresholds,
        )
        for name, counts in baselines.items()
    }
    evidence: dict[str, Any] = {name: d.evidence for name, d in decisions.items()}
    reasons = [f"{name}: {reason}" for name, d in decisions.items() for reason in d.reasons]
    rollback = [name for name, d in decisions.items() if d.verdict is Verdict.ROLLBACK]
    if rollback:
        verdict = Verdict.ROLLBACK
        reasons = [r for r in reasons if r.split(":", 1)[0] in rollback]
    elif period_complete:
        verdict = Verdict.PASS
    else:
        verdict = Verdict.CONTINUE
    return GateDecision(
        gate=WATCH,
        passed=verdict is Verdict.PASS,
        reasons=reasons,
        evidence={"baselines": evidence},
        verdict=verdict,
        rollback=verdict is Verdict.ROLLBACK,
    )
