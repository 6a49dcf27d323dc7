"""The canary gate: continue, abort on regression, or pass, from cumulative outcomes.

The rule is stated in ``gates.sequential``; ``canary_verdict_codes`` is the whole
decision over numpy arrays (used as is by the calibration simulation), and
``decide_canary`` wraps it with the evidence and reasons a reviewer reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from governance_loop.gates.always_valid import evidence_boundary
from governance_loop.gates.decision import GateDecision, Verdict
from governance_loop.gates.sequential import (
    TEST_NAME,
    MetricTest,
    RewardSummary,
    alpha_boundary,
    arm_evidence,
    describe,
    effect_words,
    metric_evidence,
    not_enough_information,
    planned_information_for,
    rate_test,
    reward_numbers,
    reward_test,
)
from governance_loop.gates.stats import BinomialCounts, evidence_number, rate_difference
from governance_loop.gates.thresholds import CanarySpec, ThresholdSpec
from triloop.statuses import Gate

# Verdict codes of the vectorised rule.
CONTINUE, ABORT, PASS, FAIL = 0, 1, 2, 3
VERDICTS = {CONTINUE: Verdict.CONTINUE, ABORT: Verdict.ABORT_REGRESSION, PASS: Verdict.PASS,
            FAIL: Verdict.FAIL}


@dataclass(frozen=True)
class CanaryObservation:
    """Cumulative canary outcomes so far, both arms over the same period."""

    canary: BinomialCounts
    production: BinomialCounts
    # True at the last look, when the soak timer has fired.
    soak_complete: bool
    canary_reward: RewardSummary | None = None
    production_reward: RewardSummary | None = None
    # 1 for the first look of this canary; 0 when the caller does not count looks.
    look: int = 0


def canary_tests(
    production: tuple[Any, Any], canary: tuple[Any, Any], spec: CanarySpec,
    production_reward: tuple[Any, Any, Any] | None = None,
    canary_reward: tuple[Any, Any, Any] | None = None,
) -> list[MetricTest]:
    """The metric tests the spec asks for: success rate (unless turned off), and reward when
    it names an effect."""
    tests = ([rate_test(production, canary, spec.regression_to_detect)]
             if spec.check_success_rate else [])
    if spec.reward_regression_to_detect is not None:
        missing = (0, 0.0, 0.0)  # no summaries: degenerate, cannot pass
        tests.append(reward_test(production_reward or missing, canary_reward or missing,
                                 effect=spec.reward_regression_to_detect))
    return tests


def canary_verdict_codes(tests: list[MetricTest], fewest_episodes: Any, soak_complete: Any,
                         spec: CanarySpec) -> NDArray[np.int64]:
    """CONTINUE/ABORT/PASS/FAIL for each entry of the tests' arrays."""
    abort_at = alpha_boundary(spec.false_abort_rate, len(tests))
    pass_at = evidence_boundary(spec.missed_regression_rate)
    ready = np.asarray(fewest_episodes) >= spec.min_samples_per_arm
    regressed = ready & np.any([t.log_regressed >= abort_at for t in tests], axis=0)
    safe = ready & np.all([t.log_not_worse >= pass_at for t in tests], axis=0)
    ended = np.where(safe, PASS, FAIL)
    codes: NDArray[np.int64] = np.where(
        regressed, ABORT, np.where(soak_complete, ended, CONTINUE)).astype(np.int64)
    return codes


def decide_canary(observation: CanaryObservation, thresholds: ThresholdSpec) -> GateDecision:
    """Continue, abort on regression, or pass the canary from cumulative outcomes."""
    spec = thresholds.canary
    version = thresholds.version
    canary, production = observation.canary, observation.production
    tests = canary_tests((production.episodes, production.successes),
                         (canary.episodes, canary.successes), spec,
                         reward_numbers(observation.production_reward),
                         reward_numbers(observation.canary_reward))
    fewest = min(canary.episodes, production.episodes)
    code = int(canary_verdict_codes(tests, fewest, observation.soak_complete, spec))
    verdict = VERDICTS[code]
    abort_at = alpha_boundary(spec.false_abort_rate, len(tests))
    pass_at = evidence_boundary(spec.missed_regression_rate)
    planned = {t.metric: planned_information_for(
        t.effect, spec.false_abort_rate / len(tests), spec.missed_regression_rate,
        two_sided=True) for t in tests}
    look = f"look {observation.look}" if observation.look else "this look"
    evidence: dict[str, Any] = {
        "threshold_version": version,
        "test": TEST_NAME,
        "look": observation.look or None,
        "thresholds": {
            "min_samples_per_arm": spec.min_samples_per_arm,
            "regression_to_detect": spec.regression_to_detect,
            "reward_regression_to_detect": spec.reward_regression_to_detect,
            "check_success_rate": spec.check_success_rate,
            "false_abort_rate": spec.false_abort_rate,
            "missed_regression_rate": spec.missed_regression_rate,
        },
        "canary": arm_evidence(canary, observation.canary_reward),
        "production": arm_evidence(production, observation.production_reward),
        "abort_boundary": evidence_number(abort_at),
        "pass_boundary": evidence_number(pass_at),
        "soak_complete": observation.soak_complete,
        "success_rate_delta": rate_difference(canary, production,
                                              thresholds.confidence).to_dict(),
        "metrics": [metric_evidence(t, planned=planned[t.metric], regressed_at=abort_at,
                                    not_worse_at=pass_at) for t in tests],
    }
    share = canary.episodes / production.episodes if production.episodes else 1.0
    for numbers, test in zip(evidence["metrics"], tests, strict=True):
        numbers["planned_canary_episodes_at_current_share"] = _planned_canary(
            test, planned[test.metric], share)

    def decision(reason: str) -> GateDecision:
        return GateDecision(
            gate=Gate.CANARY, passed=verdict is Verdict.PASS,
            reasons=[f"{reason} (thresholds {version})"], evidence=evidence, verdict=verdict,
            restore_routing=verdict in (Verdict.ABORT_REGRESSION, Verdict.FAIL),
        )

    if fewest < spec.min_samples_per_arm:
        shortfall = (f"canary {canary.episodes} and production {production.episodes} episodes; "
                     f"min_samples_per_arm is {spec.min_samples_per_arm}")
        if verdict is Verdict.FAIL:
            return decision(f"soak ended with too few episodes at {look}: {shortfall}; "
                            "extend the soak or raise the canary share")
        return decision(f"continue: waiting for the minimum sample at {look}: {shortfall}")
    if verdict is Verdict.ABORT_REGRESSION:
        worst = max(tests, key=lambda t: float(t.log_regressed))
        return decision(
            f"canary regressed at {look}: {TEST_NAME} on {describe(worst)}, "
            f"ln M {float(worst.log_regressed):.3f} >= abort boundary {abort_at:.3f}")
    degenerate = [t for t in tests if bool(t.degenerate)]
    lacking = "; ".join(not_enough_information(t, (canary, production)) for t in degenerate)
    if verdict is Verdict.PASS:
        shown = ", ".join(
            f"{describe(t)}, not worse by {effect_words(t)}: ln M {float(t.log_not_worse):.3f} "
            f">= pass boundary {pass_at:.3f}" for t in tests)
        return decision(f"no regression at {look}: {TEST_NAME}: {shown}")
    progress = "; ".join(_progress(t, planned[t.metric], abort_at, pass_at, share)
                         for t in tests if not bool(t.degenerate))
    if verdict is Verdict.FAIL:
        if degenerate:
            return decision(f"soak ended without enough information at {look}: {lacking}; "
                            "extend the soak or raise the canary share")
        return decision(f"soak ended undecided at {look}: {progress}; extend the soak or "
                        "raise the canary share")
    if degenerate:
        return decision(f"continue: not enough information at {look}: {lacking}")
    return decision(f"continue: soak in progress at {look}: {progress}")


def _progress(test: MetricTest, planned: float, abort_at: float, pass_at: float,
              share: float) -> str:
    episodes = _planned_canary(test, planned, share)
    plan = f" (~{episodes} canary episodes at this share)" if episodes is not None else ""
    return (f"{describe(test)}, ln M regressed {float(test.log_regressed):.3f} of "
            f"{abort_at:.3f}, not worse by {effect_words(test)} "
            f"{float(test.log_not_worse):.3f} of {pass_at:.3f}; information "
            f"{float(test.information) / planned:.0%} of the plan{plan}")


def _planned_canary(test: MetricTest, planned: float, canary_per_production: float
                    ) -> int | None:
    """Canary episodes reaching the planned information with the arms' current ratio."""
    unit = float(test.unit_variance)
    if bool(test.degenerate) or unit <= 0 or canary_per_production <= 0:
        return None
    return math.ceil(unit * planned * (1 + canary_per_production))
