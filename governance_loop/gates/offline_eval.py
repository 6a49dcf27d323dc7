"""Offline-eval gate: candidate and production on frozen eval sets against thresholds.

Rule: on every eval set, each policy needs ``min_samples`` episodes, and the
candidate's *observed* success rate must reach ``min_success_rate`` and lose no
more than ``max_regression_vs_production`` against production (and, when set,
its mean reward no more than ``max_reward_regression_vs_production``). Eval sets
are frozen, so the comparison is on point estimates; the confidence intervals go
into the evidence for the auditor. Given the eval episodes, the behaviour audit
(``gates.behaviour_audit``) goes into the evidence too, and a flagged signal the
threshold's ``audit.blocking`` names fails the gate. Given a placebo arm (the threshold
requires the placebo control), the candidate must also beat the placebo's success rate by
the margin on every set (``gates.placebo``). A rise in mean reward over production must
come from the task, not from shaping terms (``thresholds.attribution``,
``gates.attribution``): each set's evidence splits the change by reward term.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from governance_loop.gates.attribution import attribute, attribution_violations
from governance_loop.gates.behaviour_audit import AuditEpisodes, audit_behaviour
from governance_loop.gates.decision import GateDecision, Verdict
from governance_loop.gates.placebo import PlaceboArm, check_placebo
from governance_loop.gates.stats import (
    EpisodeStats,
    evidence_number,
    mean_difference,
    rate_difference,
    rate_falls_by_more_than,
    summary_mean_interval,
    wilson_interval,
)
from governance_loop.gates.thresholds import ThresholdSpec
from triloop.statuses import Gate


@dataclass(frozen=True)
class EvalSetResult:
    """Both policies' results on one frozen eval set."""

    eval_set: str
    # The frozen eval set's version (its content hash), so the decision names what it measured.
    eval_set_version: str
    candidate: EpisodeStats
    # None when nothing is in production yet (the first promotion).
    production: EpisodeStats | None
    # Each counted episode's reward split by term (the verifier's ``details.terms``), per
    # policy; None when not read, and then a rise in reward cannot be attributed.
    candidate_terms: Sequence[Mapping[str, float]] | None = None
    production_terms: Sequence[Mapping[str, float]] | None = None
    # The eval set's contracts' process terms (which terms are per-step, not shaping).
    process_terms: frozenset[str] = frozenset()


def _policy_evidence(stats: EpisodeStats, confidence: float) -> dict[str, Any]:
    reward = summary_mean_interval(stats.reward_mean, stats.reward_std, stats.episodes, confidence)
    return {
        "episodes": stats.episodes,
        "successes": stats.successes,
        "success_rate": wilson_interval(stats.counts, confidence).to_dict(),
        "reward_mean": reward.to_dict(),
        "reward_std": evidence_number(stats.reward_std),
    }


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def _points(value: float) -> str:
    return f"{value * 100:.1f} points"


def _check_eval_set(result: EvalSetResult, spec: ThresholdSpec) -> tuple[list[str], dict[str, Any]]:
    name, version = result.eval_set, spec.version
    cand, prod = result.candidate, result.production
    violations: list[str] = []
    evidence: dict[str, Any] = {
        "eval_set": name,
        "eval_set_version": result.eval_set_version,
        "candidate": _policy_evidence(cand, spec.confidence),
        "production": None if prod is None else _policy_evidence(prod, spec.confidence),
    }
    for label, stats in (("candidate", cand), ("production", prod)):
        if stats is not None and stats.episodes < spec.min_samples:
            violations.append(
                f"eval set {name!r}: {label} has {stats.episodes} episodes, "
                f"min_samples is {spec.min_samples} (thresholds {version})"
            )
    if cand.counts.rate < spec.min_success_rate:
        violations.append(
            f"eval set {name!r}: candidate success rate {_pct(cand.counts.rate)} is below "
            f"min_success_rate {_pct(spec.min_success_rate)} (thresholds {version})"
        )
    if prod is not None:
        rate_delta = rate_difference(cand.counts, prod.counts, spec.confidence)
        reward_delta = mean_difference(cand, prod, spec.confidence)
        evidence["success_rate_delta"] = rate_delta.to_dict()
        evidence["reward_delta"] = reward_delta.to_dict()
        if rate_falls_by_more_than(cand.counts, prod.counts,
                                   spec.max_regression_vs_production):
            violations.append(
                f"eval set {name!r}: candidate success rate is "
                f"{_points(-rate_delta.estimate)} below production, "
                f"max_regression_vs_production is {_points(spec.max_regression_vs_production)} "
                f"(thresholds {version})"
            )
        max_reward = spec.max_reward_regression_vs_production
        if max_reward is not None and reward_delta.estimate < -max_reward:
            violations.append(
                f"eval set {name!r}: candidate mean reward is {-reward_delta.estimate:.4g} "
                f"below production, max_reward_regression_vs_production is {max_reward:.4g} "
                f"(thresholds {version})"
            )
    violations += _attribution(result, spec, evidence)
    evidence["violations"] = violations
    return violations, evidence


def _attribution(result: EvalSetResult, spec: ThresholdSpec,
                 evidence: dict[str, Any]) -> list[str]:
    """Split the change in reward by term into ``evidence["attribution"]``; its refusals."""
    name, version = result.eval_set, spec.version
    cand, prod = result.candidate, result.production
    mine, theirs = result.candidate_terms, result.production_terms
    if mine is None or (prod is not None and theirs is None):
        evidence["attribution"] = None
        rose = prod is not None and cand.reward_mean > prod.reward_mean
        if rose and spec.attribution.min_task_share is not None:
            return [f"eval set {name!r}: mean reward rose over production, but the episodes' "
                    f"reward terms were not read, so min_task_share cannot be checked "
                    f"(thresholds {version})"]
        return []
    found = attribute(mine, None if prod is None else theirs,
                      process_terms=result.process_terms,
                      success_rate_delta=None if prod is None
                      else cand.counts.rate - prod.counts.rate,
                      min_task_share=spec.attribution.min_task_share)
    violations = attribution_violations(found, spec.attribution, eval_set=name, version=version)
    evidence["attribution"] = found.to_dict(violations)
    return violations


def decide_offline_eval(
    results: Sequence[EvalSetResult], thresholds: ThresholdSpec,
    audit: AuditEpisodes | None = None,
    placebo: PlaceboArm | None = None,
) -> GateDecision:
    """Pass only when every eval set meets every offline threshold (given the eval
    episodes, no signal of the behaviour audit that ``thresholds.audit.blocking`` names is
    flagged; given the placebo arm, the candidate beats the placebo by the margin on each)."""
    names = [r.eval_set for r in results]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"eval sets reported more than once: {duplicates}")
    reasons: list[str] = []
    per_set: list[dict[str, Any]] = []
    if not results:
        reasons.append("no eval set results: the candidate was not evaluated")
    for result in results:
        violations, evidence = _check_eval_set(result, thresholds)
        reasons.extend(violations)
        per_set.append(evidence)
    behaviour = None if audit is None else audit_behaviour(audit, thresholds.audit)
    if behaviour is not None:
        reasons.extend(behaviour.blocking_reasons(thresholds.version))
    against_placebo = None if placebo is None else check_placebo(
        {r.eval_set: r.candidate for r in results}, placebo, thresholds)
    if against_placebo is not None:
        reasons.extend(against_placebo.reasons)
    passed = not reasons
    return GateDecision(
        gate=Gate.OFFLINE_EVAL,
        passed=passed,
        reasons=reasons or [f"all {len(results)} eval sets meet thresholds {thresholds.version}"],
        evidence={
            "threshold_version": thresholds.version,
            "thresholds": {
                "min_success_rate": thresholds.min_success_rate,
                "max_regression_vs_production": thresholds.max_regression_vs_production,
                "max_reward_regression_vs_production":
                    thresholds.max_reward_regression_vs_production,
                "min_samples": thresholds.min_samples,
                "confidence": thresholds.confidence,
                "attribution": asdict(thresholds.attribution),
            },
            "eval_sets": per_set,
            **({} if behaviour is None else {"behaviour_audit": behaviour.to_evidence()}),
            **({} if against_placebo is None else {"placebo": against_placebo.evidence}),
        },
        verdict=Verdict.PASS if passed else Verdict.FAIL,
    )
