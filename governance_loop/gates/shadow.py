"""Shadow gate: the candidate acts beside production on the same live tasks, unapplied.

Rule (with n paired episodes, agreement = agreed steps / compared steps, and
delta_i = candidate reward - production reward for episode i):

    pass  iff  n >= min_samples
          and  (agreement >= agreement_floor  or  upper CI bound of mean(delta) >= 0)
          and  mean(delta) >= -max_mean_reward_regression

High agreement means the candidate behaves like production, so the reward test
has little to say and the gate should not fail on noise. A candidate that
behaves differently must earn the pass with reward: its delta may not be
significantly negative. The guard stops either branch from waving through a
measured loss larger than the tolerated margin. The interval is a normal
approximation on paired deltas (no bootstrap: this runs inside deterministic
workflow code).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from governance_loop.gates.decision import GateDecision, Verdict
from governance_loop.gates.stats import evidence_number, mean_interval
from governance_loop.gates.thresholds import ThresholdSpec
from triloop.statuses import Gate


@dataclass(frozen=True)
class ShadowSample:
    """One live episode that production ran while the candidate shadowed it."""

    episode_id: str
    # Steps where both policies proposed an action, and how many of those matched.
    steps_compared: int
    steps_agreed: int
    production_reward: float
    # The environment's reward rule applied to the candidate's unapplied actions.
    candidate_reward: float

    def __post_init__(self) -> None:
        if not 0 <= self.steps_agreed <= self.steps_compared:
            raise ValueError(
                f"episode {self.episode_id}: need 0 <= steps_agreed <= steps_compared, "
                f"got {self.steps_agreed} of {self.steps_compared}"
            )
        if not (math.isfinite(self.production_reward) and math.isfinite(self.candidate_reward)):
            raise ValueError(f"episode {self.episode_id}: rewards must be finite")


def decide_shadow(samples: Sequence[ShadowSample], thresholds: ThresholdSpec) -> GateDecision:
    """Decide the shadow gate at the end of its soak."""
    spec = thresholds.shadow
    version = thresholds.version
    n = len(samples)
    compared = sum(s.steps_compared for s in samples)
    agreed = sum(s.steps_agreed for s in samples)
    agreement = agreed / compared if compared else None
    deltas = [s.candidate_reward - s.production_reward for s in samples]
    delta = mean_interval(deltas, spec.confidence)
    significantly_negative = delta.high < 0
    high_agreement = agreement is not None and agreement >= spec.agreement_floor

    reasons: list[str] = []
    if n < spec.min_samples:
        reasons.append(
            f"shadow saw {n} paired episodes, min_samples is {spec.min_samples} "
            f"(thresholds {version})"
        )
    elif not high_agreement and significantly_negative:
        shown = "n/a (no steps compared)" if agreement is None else f"{agreement:.3f}"
        reasons.append(
            f"action agreement {shown} is below agreement_floor {spec.agreement_floor} and "
            f"the mean reward delta {delta.estimate:.4g} is significantly negative "
            f"({spec.confidence:.0%} CI upper bound {delta.high:.4g} < 0) (thresholds {version})"
        )
    if n and delta.estimate < -spec.max_mean_reward_regression:
        reasons.append(
            f"mean reward delta {delta.estimate:.4g} is below "
            f"-max_mean_reward_regression {spec.max_mean_reward_regression:.4g} "
            f"(thresholds {version})"
        )
    passed = not reasons
    if passed:
        why = (
            f"agreement {agreement:.3f} >= {spec.agreement_floor}"
            if high_agreement and agreement is not None
            else "reward delta not significantly negative"
        )
        reasons.append(f"shadow passed over {n} paired episodes: {why} (thresholds {version})")
    return GateDecision(
        gate=Gate.SHADOW,
        passed=passed,
        reasons=reasons,
        evidence={
            "threshold_version": version,
            "thresholds": {
                "min_samples": spec.min_samples,
                "agreement_floor": spec.agreement_floor,
                "confidence": spec.confidence,
                "max_mean_reward_regression": spec.max_mean_reward_regression,
            },
            "paired_episodes": n,
            "steps_compared": compared,
            "steps_agreed": agreed,
            "agreement_rate": evidence_number(agreement),
            "reward_delta": delta.to_dict(),
            "production_reward_mean": evidence_number(
                sum(s.production_reward for s in samples) / n if n else None
            ),
            "candidate_reward_mean": evidence_number(
                sum(s.candidate_reward for s in samples) / n if n else None
            ),
            "reward_delta_significantly_negative": significantly_negative,
        },
        verdict=Verdict.PASS if passed else Verdict.FAIL,
    )
