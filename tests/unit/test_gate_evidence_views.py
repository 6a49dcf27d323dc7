"""Reward attribution (per term) and the shortcut audit render from the evidence shapes
DESIGN §2 and §3 document, and gate results written before them still render."""

from __future__ import annotations

from typing import Any

from tests.factories_gate_evidence import AUDIT, SHORTCUT, offline_evidence
from web.console.gate_analysis import analyse_gate

SPEC: dict[str, Any] = {"version": "t", "min_success_rate": 0.0,
                        "max_regression_vs_production": 0.05, "min_samples": 64,
                        "attribution": {"min_task_share": 0.5}}


def test_a_shaping_only_gain_shows_its_terms_and_fails_its_row() -> None:
    evidence = offline_evidence(eval_set={"attribution": SHORTCUT,
                                          "violations": SHORTCUT["violations"]})
    analysis = analyse_gate(gate="offline_eval", passed=False, reasons=SHORTCUT["violations"],
                            evidence=evidence, threshold_spec=SPEC)
    [view] = analysis.attributions
    assert view.title == "eval set maps@v1" and view.baseline == "production" and view.blocking
    assert [(t.term, t.kind, t.delta) for t in view.terms] == [
        ("success", "task", "+0.0156"), ("progress", "shaping", "+0.36"),
        ("valid_action", "process", "+0.02"), ("failure", "shaping", "-0.17")]
    assert view.shaping_only and view.shaping_terms == "progress (+0.36), valid_action (+0.02)"
    assert [t.term for t in view.terms if t.shortcut] == ["progress", "valid_action"]
    assert ("task term's share of the gain", "4.1%") in view.facts
    share = next(c for c in analysis.checks if "share of the reward gain" in c.name)
    assert (share.measured, share.bar, share.outcome) == ("4.1%", "≥ 50.0%", "unmet")
    assert "progress (+0.36)" in share.note
    assert analysis.verdict.startswith("Offline eval failed: 1 of 5 checks did not meet its bar")


def test_shadow_and_canary_attribution_is_recorded_not_blocking() -> None:
    honest = {**SHORTCUT, "shaping_only": False, "violations": []}
    for gate in ("shadow", "canary"):
        analysis = analyse_gate(gate=gate, passed=True, reasons=["ok"],
                                evidence={"attribution": honest}, threshold_spec=None)
        [view] = analysis.attributions
        assert not view.blocking and not view.shaping_only and view.shaping_terms == ""
        assert not any(t.shortcut for t in view.terms)


def test_the_audit_highlights_flagged_signals_and_marks_the_blocking_one() -> None:
    evidence = offline_evidence(behaviour_audit=AUDIT)
    reason = "behaviour audit: invalid actions flagged (blocking)"
    analysis = analyse_gate(gate="offline_eval", passed=False, reasons=[reason],
                            evidence=evidence, threshold_spec=SPEC)
    audit = analysis.audit
    assert audit is not None and audit.baseline == "production"
    # Flagged first, the blocking one before the others.
    assert [(s.name, s.flagged, s.blocking) for s in audit.signals] == [
        ("action_format/invalid_rate", True, True), ("termination/fell_in_hole", True, False),
        ("length/mean_turns", False, False)]
    assert audit.signals[1].detail == "16 of 64 vs 5 of 64" and audit.signals[1].shift == "+0.17"
    row = next(c for c in analysis.checks if c.name.startswith("Shortcut audit"))
    assert (row.name, row.outcome) == ("Shortcut audit: invalid actions", "unmet")
    assert analysis.outcome == "fail" and "Shortcut audit: invalid actions" in analysis.verdict


def test_older_gate_results_without_the_new_keys_render_as_before() -> None:
    analysis = analyse_gate(gate="offline_eval", passed=True, reasons=["all met"],
                            evidence=offline_evidence(), threshold_spec=SPEC)
    assert analysis.attributions == [] and analysis.audit is None
    assert analysis.verdict == "Offline eval passed: all 4 checks met their bars."
    odd = offline_evidence(eval_set={"attribution": "not a mapping"}, behaviour_audit=[1])
    analysis = analyse_gate(gate="offline_eval", passed=True, reasons=["all met"],
                            evidence=odd, threshold_spec=SPEC)
    assert analysis.attributions == [] and analysis.audit is None


def test_a_gate_failed_on_a_rule_without_a_row_says_so_in_a_row() -> None:
    # A newer rule (the placebo control, say) failed the gate; every row shown is met.
    reason = "placebo: candidate beats the placebo by 1.0 points, margin is 5.0 points"
    analysis = analyse_gate(gate="offline_eval", passed=False, reasons=[reason],
                            evidence=offline_evidence(), threshold_spec=SPEC)
    last = analysis.checks[-1]
    assert (last.name, last.note, last.outcome) == ("Governance's reason", reason, "unmet")
    assert analysis.verdict.startswith("Offline eval failed: 1 of 5 checks did not meet its "
                                       "bar: Governance's reason (placebo: candidate beats")


def test_an_attribution_violation_without_a_bar_on_the_page_still_fails_a_row() -> None:
    # A threshold version without an attribution section: the gate applied its default, so
    # the page has no bar to show, yet the violation is a row, not only a reason.
    evidence = offline_evidence(eval_set={"attribution": SHORTCUT,
                                          "violations": SHORTCUT["violations"]})
    spec = {k: v for k, v in SPEC.items() if k != "attribution"}
    analysis = analyse_gate(gate="offline_eval", passed=False, reasons=SHORTCUT["violations"],
                            evidence=evidence, threshold_spec=spec)
    row = analysis.checks[-1]
    assert (row.name, row.outcome, row.note) == ("maps@v1: reward attribution", "unmet",
                                                 SHORTCUT["violations"][0])
    assert "(needs —)" not in analysis.verdict and "reward attribution (eval set" in \
        analysis.verdict
