"""The watch after promotion: roll back on a regression against a pre-promotion baseline.

The rule is stated in ``gates.sequential``. ``watch_tests`` and
``watch_verdict_codes`` are the decision over numpy arrays (used as is by the
calibration simulation); ``decide_watch`` and ``decide_watch_against_baselines``
add the evidence and reasons.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from governance_loop.gates.decision import GateDecision, Verdict
from governance_loop.gates.sequential import (
    MEAN_REWARD,
    TEST_NAME,
    MetricTest,
    RewardSummary,
    alpha_boundary,
    arm_evidence,
    describe,
    metric_evidence,
    not_enough_information,
    planned_information_for,
    rate_test,
    reward_numbers,
    reward_test,
)
from governance_loop.gates.stats import BinomialCounts, evidence_number, rate_difference
from governance_loop.gates.thresholds import ThresholdSpec, WatchSpec
from triloop.statuses import Gate

CONTINUE, ROLLBACK, PASS = 0, 1, 2


@dataclass(frozen=True)
class WatchObservation:
    """Outcomes of the promoted model against one pre-promotion baseline."""

    baseline: BinomialCounts
    promoted: BinomialCounts
    # True at the last look, when the watch period has ended.
    period_complete: bool
    baseline_reward: RewardSummary | None = None
    promoted_reward: RewardSummary | None = None
    # 1 for the first look after promotion; 0 when the caller does not count looks.
    look: int = 0


def tests_per_baseline(spec: WatchSpec) -> int:
    """Metrics the watch tests against each baseline: success rate, and reward if set."""
    return 1 if spec.max_reward_regression is None else 2


def watch_tests(
    baseline: tuple[Any, Any], promoted: tuple[Any, Any], spec: WatchSpec,
    baseline_reward: tuple[Any, Any, Any] | None = None,
    promoted_reward: tuple[Any, Any, Any] | None = None,
) -> list[MetricTest]:
    """The metric tests of the promoted model against one baseline."""
    tests = [rate_test(baseline, promoted, spec.regression_to_detect)]
    if spec.max_reward_regression is not None:
        missing = (0, 0.0, 0.0)  # no summaries: degenerate, no evidence
        tests.append(reward_test(
            baseline_reward or missing, promoted_reward or missing,
            effect=spec.reward_regression_to_detect or spec.regression_to_detect,
            tolerance=spec.max_reward_regression))
    return tests


def watch_verdict_codes(tests: list[MetricTest], promoted_episodes: Any, period_complete: Any,
                        spec: WatchSpec, *, tests_sharing_alpha: int) -> NDArray[np.int64]:
    """CONTINUE/ROLLBACK/PASS for each entry of the tests' arrays."""
    rollback_at = alpha_boundary(spec.false_rollback_rate, tests_sharing_alpha)
    ready = np.asarray(promoted_episodes) >= spec.min_samples
    regressed = ready & np.any([t.log_regressed >= rollback_at for t in tests], axis=0)
    codes: NDArray[np.int64] = np.where(
        regressed, ROLLBACK, np.where(period_complete, PASS, CONTINUE)).astype(np.int64)
    return codes


def decide_watch(observation: WatchObservation, thresholds: ThresholdSpec, *,
                 tests_sharing_alpha: int | None = None) -> GateDecision:
    """Roll back on a regression against one pre-promotion baseline, else keep watching."""
    spec = thresholds.watch
    version = thresholds.version
    baseline, promoted = observation.baseline, observation.promoted
    tests = watch_tests((baseline.episodes, baseline.successes),
                        (promoted.episodes, promoted.successes), spec,
                        reward_numbers(observation.baseline_reward),
                        reward_numbers(observation.promoted_reward))
    sharing = tests_sharing_alpha or len(tests)
    code = int(watch_verdict_codes(tests, promoted.episodes, observation.period_complete, spec,
                                   tests_sharing_alpha=sharing))
    verdict = {CONTINUE: Verdict.CONTINUE, ROLLBACK: Verdict.ROLLBACK, PASS: Verdict.PASS}[code]
    rollback_at = alpha_boundary(spec.false_rollback_rate, sharing)
    planned = {t.metric: planned_information_for(
        t.effect, spec.false_rollback_rate / sharing, spec.missed_regression_rate,
        two_sided=False) for t in tests}
    look = f"look {observation.look}" if observation.look else "this look"
    evidence: dict[str, Any] = {
        "threshold_version": version,
        "test": TEST_NAME,
        "look": observation.look or None,
        "thresholds": {
            "min_samples": spec.min_samples,
            "regression_to_detect": spec.regression_to_detect,
            "false_rollback_rate": spec.false_rollback_rate,
            "missed_regression_rate": spec.missed_regression_rate,
            "max_reward_regression": spec.max_reward_regression,
            "tests_sharing_alpha": sharing,
        },
        "baseline": arm_evidence(baseline, observation.baseline_reward),
        "promoted": arm_evidence(promoted, observation.promoted_reward),
        "rollback_boundary": evidence_number(rollback_at),
        "period_complete": observation.period_complete,
        "success_rate_delta": rate_difference(promoted, baseline,
                                              thresholds.confidence).to_dict(),
        "metrics": [],
    }
    for test in tests:
        numbers = metric_evidence(test, planned=planned[test.metric], regressed_at=rollback_at,
                                  not_worse_at=None)
        numbers["planned_promoted_episodes"] = _planned_promoted(
            test, planned[test.metric], baseline.episodes)
        evidence["metrics"].append(numbers)

    if promoted.episodes < spec.min_samples:
        reason = (f"continue: promoted model has {promoted.episodes} episodes and the baseline "
                  f"{baseline.episodes} at {look}; min_samples is {spec.min_samples}, no "
                  "rollback evidence")
    elif verdict is Verdict.ROLLBACK:
        worst = max(tests, key=lambda t: float(t.log_regressed))
        above = f" beyond the tolerance {worst.tolerance:.4g}" if worst.tolerance else ""
        fell = "mean reward fell: " if worst.metric == MEAN_REWARD else ""
        reason = (f"regression after promotion at {look}: {fell}{TEST_NAME} on "
                  f"{describe(worst)}{above}, ln M {float(worst.log_regressed):.3f} >= "
                  f"rollback boundary {rollback_at:.3f}")
    else:
        parts = []
        for test in tests:
            if bool(test.degenerate):
                wait = "" if observation.period_complete else "continue: "
                parts.append(f"{wait}not enough information: "
                             + not_enough_information(test, (baseline, promoted)))
            else:
                parts.append(f"{describe(test)}, ln M {float(test.log_regressed):.3f} < "
                             f"{rollback_at:.3f}")
        state = "watch period complete" if observation.period_complete else "watching"
        reason = f"no regression detected at {look} ({state}): " + "; ".join(parts)
    return GateDecision(
        gate=Gate.WATCH, passed=verdict is Verdict.PASS,
        reasons=[f"{reason} (thresholds {version})"],
        evidence=evidence, verdict=verdict, rollback=verdict is Verdict.ROLLBACK,
    )


def decide_watch_against_baselines(
    baselines: Mapping[str, BinomialCounts],
    promoted: BinomialCounts,
    *,
    period_complete: bool,
    thresholds: ThresholdSpec,
    rewards: Mapping[str, RewardSummary] | None = None,
    promoted_reward: RewardSummary | None = None,
    look: int = 0,
) -> GateDecision:
    """Watch against every pre-promotion baseline; the first regression rolls back.

    Two baselines exist before a promotion: the model production served, and the
    candidate itself during its canary (the evidence it was promoted on). A model
    that falls below either after promotion has regressed. alpha is shared by every
    baseline and metric, so the false-rollback rate of the whole watch stays alpha.
    """
    sharing = len(baselines) * tests_per_baseline(thresholds.watch)
    decisions = {
        name: decide_watch(
            WatchObservation(
                baseline=counts, promoted=promoted, period_complete=period_complete,
                baseline_reward=(rewards or {}).get(name), promoted_reward=promoted_reward,
                look=look,
            ),
            thresholds, tests_sharing_alpha=sharing,
        )
        for name, counts in baselines.items()
    }
    evidence: dict[str, Any] = {name: d.evidence for name, d in decisions.items()}
    rollback = [name for name, d in decisions.items() if d.verdict is Verdict.ROLLBACK]
    # Each reason names the baseline it was judged against, quoted, so that a baseline's
    # name (a window of episodes) does not read as part of the verdict.
    reasons = [f"baseline {name!r}: {reason}" for name, d in decisions.items()
               if name in rollback or not rollback for reason in d.reasons]
    if rollback:
        verdict = Verdict.ROLLBACK
    elif period_complete:
        verdict = Verdict.PASS
    else:
        verdict = Verdict.CONTINUE
    return GateDecision(
        gate=Gate.WATCH,
        passed=verdict is Verdict.PASS,
        reasons=reasons,
        evidence={"baselines": evidence, "look": look or None, "test": TEST_NAME},
        verdict=verdict,
        rollback=verdict is Verdict.ROLLBACK,
    )


def _planned_promoted(test: MetricTest, planned: float, baseline_episodes: int) -> int | None:
    """Promoted episodes that reach the planned information; None if the baseline is too small.

    The baseline is fixed once promoted, so information is capped at n_baseline / variance.
    """
    unit = float(test.unit_variance)
    if bool(test.degenerate) or unit <= 0 or baseline_episodes < 1:
        return None
    spare = 1 / (unit * planned) - 1 / baseline_episodes
    return math.ceil(1 / spare) if spare > 0 else None

