"""A fault may make a gate fail, never pass: the pure rule over two decisions."""

from __future__ import annotations

from governance_loop.gates import (
    BinomialCounts,
    CanaryObservation,
    GateDecision,
    ThresholdSpec,
    Verdict,
    decide_canary,
    without_fault_passes,
)

SPEC = ThresholdSpec.from_mapping({
    "version": "t1", "min_success_rate": 0.5, "min_samples": 8,
    "max_regression_vs_production": 0.2,
    "canary": {"min_samples_per_arm": 10, "regression_to_detect": 0.3},
})
FAULT = {"checkpoint_id": "prod-1", "temperature": 8.0, "note": "game day"}


def canary(canary_counts: tuple[int, int], production: tuple[int, int], *, done: bool = True
           ) -> GateDecision:
    return decide_canary(CanaryObservation(canary=BinomialCounts(*canary_counts),
                                           production=BinomialCounts(*production),
                                           soak_complete=done), SPEC)


def test_faulted_production_episodes_cannot_pass_a_candidate() -> None:
    # Production degraded by a fault: with them the candidate looks better and passes ...
    everything = canary((40, 36), (40, 10))
    assert everything.verdict is Verdict.PASS
    # ... without them production has too few episodes to compare with.
    clean = canary((40, 36), (4, 3))
    decision = without_fault_passes(all_episodes=everything, clean_episodes=clean,
                                    faults=[FAULT], faulted_episodes=36)
    assert decision.verdict is Verdict.FAIL and not decision.passed
    assert decision.evidence["injected_faults"] == [FAULT]
    assert decision.evidence["episodes_under_fault"] == 36
    assert decision.evidence["verdict_with_faulted_episodes"] == "pass"
    assert any("checkpoint prod-1 served at temperature 8.0 (game day)" in r
               and "never pass" in r for r in decision.reasons)


def test_faulted_candidate_episodes_can_abort_it() -> None:
    everything = canary((40, 4), (40, 36), done=False)
    assert everything.verdict is Verdict.ABORT_REGRESSION
    clean = canary((0, 0), (40, 36), done=False)
    decision = without_fault_passes(all_episodes=everything, clean_episodes=clean,
                                    faults=[FAULT], faulted_episodes=40)
    assert decision.verdict is Verdict.ABORT_REGRESSION and decision.restore_routing
    assert "served under an injected fault" in decision.reasons[-1]
    assert decision.evidence["injected_faults"] == [FAULT]


def test_no_fault_changes_nothing() -> None:
    everything = canary((40, 36), (40, 35))
    assert without_fault_passes(all_episodes=everything, clean_episodes=everything,
                                faults=[], faulted_episodes=0) is everything
