"""Each gate summary is computed from the rows beneath it: one test per contradiction a
new user found on the promotion page (issue 27, item 5), on real gate decisions."""

from __future__ import annotations

import itertools
import re
from typing import Any

from governance_loop.gates.canary import CanaryObservation, decide_canary
from governance_loop.gates.offline_eval import EvalSetResult, decide_offline_eval
from governance_loop.gates.shadow import ShadowSample, decide_shadow
from governance_loop.gates.stats import BinomialCounts, EpisodeStats
from governance_loop.gates.thresholds import ThresholdSpec
from web.console.gate_analysis import GateAnalysis, analyse_gate, open_gate_notice
from web.data.gate_traffic import TrafficProgress

SPEC: dict[str, Any] = {
    "version": "t-27", "min_success_rate": 0.0, "max_regression_vs_production": 0.05,
    "max_reward_regression_vs_production": 0.0, "min_samples": 10,
    "shadow": {"min_samples": 12, "agreement_floor": 0.9, "max_mean_reward_regression": 0.0},
    "canary": {"min_samples_per_arm": 40, "regression_to_detect": 0.2},
}
THRESHOLDS = ThresholdSpec.from_mapping(SPEC)


def analysed(decision: Any, spec: dict[str, Any] = SPEC) -> GateAnalysis:
    return analyse_gate(gate=decision.gate, passed=decision.passed, reasons=decision.reasons,
                        evidence=decision.evidence, threshold_spec=spec)


def assert_summary_matches_rows(analysis: GateAnalysis, passed: bool) -> None:
    """What every summary must hold to: its counts are the rows' counts, and "all met" or
    "passed" never sits above a row that is not met."""
    judged = analysis.judged
    unmet = [c for c in judged if c.outcome != "met"]
    claimed = re.search(r"all (\d+) checks met", analysis.verdict)
    if claimed:
        assert int(claimed.group(1)) == len(judged) and not unmet, analysis
    counted = re.search(r"(\d+) of (\d+) checks?", analysis.verdict)
    if counted:
        assert int(counted.group(2)) == len(judged), analysis
        assert int(counted.group(1)) == len(unmet), analysis
    if passed and judged:
        assert claimed or "but" in analysis.verdict, analysis
    if not passed:
        assert not claimed and "passed" not in analysis.verdict.split(":")[0], analysis
        assert unmet or not judged, f"a failed gate above rows that are all met: {analysis}"


# -- "Shadow passed: all 3 checks met their bars" above a red fail row -----------------

def test_a_shadow_passed_on_reward_despite_low_agreement_shows_no_failed_row() -> None:
    # Half the steps agree (floor 90%), the reward delta is not significantly negative: the
    # shadow rule passes this, so the row that holds agreement must not read "fail".
    samples = [ShadowSample(f"e{i}", 10, 5, 1.0, 1.0 + (0.1 if i % 2 else -0.1))
               for i in range(20)]
    decision = decide_shadow(samples, THRESHOLDS)
    assert decision.passed
    analysis = analysed(decision)
    assert [c.outcome for c in analysis.checks] == ["met", "met", "met"]
    assert analysis.verdict == "Shadow passed: all 3 checks met their bars."
    agreement = analysis.checks[1]
    assert "agreement 50.0%" in agreement.measured and "or upper bound ≥ 0" in agreement.bar
    assert "below its floor" in agreement.note
    assert_summary_matches_rows(analysis, decision.passed)


def test_a_shadow_failed_on_low_agreement_and_worse_reward_names_that_row() -> None:
    samples = [ShadowSample(f"e{i}", 10, 5, 1.0, 0.7 + 0.01 * i) for i in range(20)]
    decision = decide_shadow(samples, THRESHOLDS)
    assert not decision.passed
    analysis = analysed(decision)
    unmet = [c.name for c in analysis.checks if c.outcome == "unmet"]
    assert unmet[0].startswith("Action agreement with production")
    assert analysis.verdict.startswith(f"Shadow failed: {len(unmet)} of 3 checks")
    assert_summary_matches_rows(analysis, decision.passed)


# -- "Canary passed: all 3 checks" above 4 rows ------------------------------------------

def test_a_canary_summary_counts_the_rows_of_its_table() -> None:
    observation = CanaryObservation(canary=BinomialCounts(400, 390),
                                    production=BinomialCounts(400, 392), soak_complete=True)
    decision = decide_canary(observation, THRESHOLDS)
    analysis = analysed(decision)
    assert decision.passed
    # The success-rate comparison has no bar: it is context beside the table, not a row.
    assert [c.name for c in analysis.context] == ["Success rate, canary vs production"]
    assert len(analysis.judged) == 3 == len(analysis.checks) - 1
    assert analysis.verdict == "Canary passed: all 3 checks met their bars."
    assert_summary_matches_rows(analysis, decision.passed)


# -- an offline-eval interval below its bar marked pass ---------------------------------

def test_an_offline_eval_row_takes_the_gates_verdict_not_rounded_evidence() -> None:
    # 94.999995% against 100%: 5.000005 points down, beyond the 5-point tolerance (the gate
    # compares the counts exactly). The evidence rounds the delta to -0.05, which re-judged
    # on the page would read "pass" under a failed gate.
    result = EvalSetResult("maps", "v1", candidate=EpisodeStats(20_000_000, 18_999_999, 0.5, 0.2),
                           production=EpisodeStats(20, 20, 0.5, 0.2))
    decision = decide_offline_eval([result], THRESHOLDS)
    assert not decision.passed
    analysis = analysed(decision)
    row = next(c for c in analysis.checks if c.name == "maps: success rate vs production")
    assert row.outcome == "unmet" and row.bar == "≥ -5.0 points"
    assert analysis.verdict.startswith("Offline eval failed: 1 of 5 checks did not meet its "
                                       "bar: maps: success rate vs production -5.0 points")
    assert_summary_matches_rows(analysis, decision.passed)


def test_no_offline_eval_interval_wholly_below_its_bar_is_met() -> None:
    # Real decisions over a grid of outcomes: each row agrees with the gate, and none whose
    # interval lies below its bar reads met (older rows without violations are judged on
    # their numbers, with the same rule).
    spec = {**SPEC, "min_success_rate": 0.5}
    thresholds = ThresholdSpec.from_mapping(spec)
    for c_wins, p_wins, c_reward in itertools.product((2, 9, 12, 16), (8, 13, 19), (0.2, 0.6)):
        result = EvalSetResult("maps", "v1", EpisodeStats(20, c_wins, c_reward, 0.3),
                               EpisodeStats(20, p_wins, 0.4, 0.3))
        decision = decide_offline_eval([result], thresholds)
        for evidence in (decision.evidence, _without_violations(decision.evidence)):
            analysis = analyse_gate(gate=decision.gate, passed=decision.passed,
                                    reasons=decision.reasons, evidence=evidence,
                                    threshold_spec=spec)
            assert_summary_matches_rows(analysis, decision.passed)
            for check in analysis.judged:
                high = _upper(check.measured)
                bar = _bar_value(check.bar)
                if high is not None and bar is not None and high < bar:
                    assert check.outcome == "unmet", check


def _without_violations(evidence: dict[str, Any]) -> dict[str, Any]:
    sets = [{k: v for k, v in s.items() if k != "violations"} for s in evidence["eval_sets"]]
    return {**evidence, "eval_sets": sets}


def _upper(measured: str) -> float | None:
    found = re.search(r", ([-+]?[\d.]+)", measured)
    return float(found.group(1)) if found else None


def _bar_value(bar: str) -> float | None:
    found = re.fullmatch(r"≥ ([-+]?[\d.]+).*", bar)
    return float(found.group(1)) if found else None


# -- a bar shown as "≥ -0" --------------------------------------------------------------

def test_a_bar_of_no_drop_reads_zero_not_minus_zero() -> None:
    # The demo's thresholds tolerate no reward drop (max 0.0): -0.0 printed as "-0".
    spec = {**SPEC, "max_regression_vs_production": 0.0}
    offline = decide_offline_eval([EvalSetResult(
        "maps", "v1", EpisodeStats(20, 10, 0.5, 0.2), EpisodeStats(20, 10, 0.5, 0.2))],
        ThresholdSpec.from_mapping(spec))
    shadow = decide_shadow([ShadowSample(f"e{i}", 4, 4, 1.0, 1.0) for i in range(12)],
                           THRESHOLDS)
    rows = analysed(offline, spec).checks + analysed(shadow).checks
    bars = [c.bar for c in rows]
    assert bars.count("≥ 0") == 2 and "≥ 0.0 points" in bars
    shown = " ".join(f"{c.measured} {c.bar}" for c in rows)
    assert not re.search(r"-0(?![.\d])|-0\.0(?!\d)", shown), shown


# -- during canary, "traffic is enough" beside "waiting for production traffic" ----------

def _traffic(counted: int, needed: int) -> TrafficProgress:
    enough = counted >= needed
    message = (f"production traffic is enough: {counted} of {needed} episodes in the smaller "
               "arm; the gate decides at the end of its soak" if enough else
               f"waiting for production traffic: {counted} of {needed} episodes")
    return TrafficProgress(gate="canary", slot_held=True, needed=needed, counted=counted,
                           arms={"canary": counted, "production": counted + 3},
                           enough=enough, message=message)


def test_an_open_canary_with_enough_traffic_no_longer_says_it_waits() -> None:
    enough = open_gate_notice("canary", SPEC, _traffic(40, 40))
    assert enough is not None and enough.enough
    assert enough.headline is not None and enough.headline.startswith(
        "Production traffic is enough: 40 of 40")
    assert enough.explanation is None
    short = open_gate_notice("canary", SPEC, _traffic(3, 40))
    assert short is not None and not short.enough
    assert short.headline == "Waiting for production traffic: 3 of 40 episodes."
    assert short.explanation is not None and "POST /api/episodes" in short.explanation
    # Watch has no live count: it keeps the explanation alone.
    watch = open_gate_notice("watch", SPEC, None)
    assert watch is not None and watch.headline is None and watch.explanation
    assert open_gate_notice("audit", SPEC, None) is None
