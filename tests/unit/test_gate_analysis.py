"""The console's gate analysis reads the evidence the real gate functions write."""

from __future__ import annotations

from typing import Any

from governance_loop.gates.canary import CanaryObservation, decide_canary
from governance_loop.gates.offline_eval import EvalSetResult, decide_offline_eval
from governance_loop.gates.shadow import ShadowSample, decide_shadow
from governance_loop.gates.stats import BinomialCounts, EpisodeStats
from governance_loop.gates.thresholds import ThresholdSpec
from web.console.gate_analysis import analyse_gate, relevant_thresholds, waiting_gate_note

SPEC: dict[str, Any] = {
    "version": "t-7", "min_success_rate": 0.6, "max_regression_vs_production": 0.05,
    "min_samples": 50, "shadow": {"min_samples": 12, "agreement_floor": 0.9},
    "canary": {"min_samples_per_arm": 40, "regression_to_detect": 0.2},
}
THRESHOLDS = ThresholdSpec.from_mapping(SPEC)


def analysed(decision: Any) -> Any:
    return analyse_gate(gate=decision.gate, passed=decision.passed, reasons=decision.reasons,
                        evidence=decision.evidence, threshold_spec=SPEC)


def test_shadow_without_traffic_says_it_needs_production_episodes() -> None:
    samples = [ShadowSample(f"e{i}", 4, 4, 1.0, 1.0) for i in range(3)]
    analysis = analysed(decide_shadow(samples, THRESHOLDS))
    assert analysis.outcome == "inconclusive" and analysis.waiting_for_traffic
    assert "did not see enough production traffic: 3, needs 12" in analysis.verdict
    assert "POST /api/episodes" in analysis.verdict
    first = analysis.checks[0]
    assert (first.name, first.measured, first.bar, first.outcome) == (
        "Paired production episodes", "3", "≥ 12", "pending")
    # Only the shadow section of the threshold version, not all ~18 bars.
    assert set(analysis.thresholds) == {"min_samples", "agreement_floor", "confidence",
                                        "max_mean_reward_regression"}


def test_offline_eval_failure_names_the_missed_bar_first() -> None:
    result = EvalSetResult("sorting", "v1", candidate=EpisodeStats(60, 30, 0.5, 0.2),
                           production=EpisodeStats(60, 45, 0.7, 0.2))
    analysis = analysed(decide_offline_eval([result], THRESHOLDS))
    assert analysis.outcome == "fail"
    assert analysis.verdict.startswith("Offline eval failed: 2 of 4 checks did not meet their "
                                       "bars: sorting: candidate success rate 50.0%")
    rows = {c.name: c for c in analysis.checks}
    assert rows["sorting: candidate episodes"].outcome == "met"
    assert rows["sorting: candidate success rate"].bar == "≥ 60.0%"
    assert rows["sorting: success rate vs production"].outcome == "unmet"
    assert "min_samples" in analysis.thresholds and "shadow" not in analysis.thresholds


def test_canary_rows_name_the_evidence_and_its_boundaries() -> None:
    observation = CanaryObservation(canary=BinomialCounts(400, 390),
                                    production=BinomialCounts(400, 392), soak_complete=True)
    analysis = analysed(decide_canary(observation, THRESHOLDS))
    assert analysis.outcome == "pass" and analysis.verdict.startswith("Canary passed: all")
    names = [c.name for c in analysis.checks]
    assert names[0] == "Episodes per arm" and analysis.checks[0].measured == \
        "canary 400 · production 400"
    assert "success rate: evidence of a regression" in names
    regression = analysis.checks[names.index("success rate: evidence of a regression")]
    assert regression.bar.startswith("abort at ≥ ") and regression.outcome == "met"


def test_unknown_or_human_gates_fall_back_to_their_reasons() -> None:
    analysis = analyse_gate(gate="audit", passed=True, reasons=["signed by ana"],
                            evidence={"user": "ana"}, threshold_spec=SPEC)
    assert analysis.checks == [] and analysis.thresholds == {}
    assert analysis.verdict == "Audit passed: signed by ana"


def test_thresholds_come_from_the_evidence_when_the_version_is_missing() -> None:
    assert relevant_thresholds("canary", None, {"thresholds": {"min_samples_per_arm": 9}}) == {
        "min_samples_per_arm": 9}
    note = waiting_gate_note("canary", SPEC)
    assert note is not None and "at least 40 episodes in each arm" in note
    assert waiting_gate_note("audit", SPEC) is None


def test_canary_evidence_before_the_minimum_sample_is_inconclusive() -> None:
    observation = CanaryObservation(canary=BinomialCounts(30, 20),
                                    production=BinomialCounts(400, 392), soak_complete=False)
    analysis = analysed(decide_canary(observation, THRESHOLDS))
    assert analysis.outcome == "inconclusive" and analysis.waiting_for_traffic
    assert {c.outcome for c in analysis.checks} <= {"pending", "context"}
    assert "did not see enough production traffic: canary 30 · production 400" in \
        analysis.verdict
