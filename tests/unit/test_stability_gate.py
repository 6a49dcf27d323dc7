"""The stability gate and the operator's override of it: pure rules, no services."""

from __future__ import annotations

import pytest

from governance_loop.gates import (
    HumanDecisionError,
    RecordedAlarm,
    StabilityCheck,
    StabilitySpec,
    ThresholdSpec,
    ThresholdSpecError,
    Verdict,
    decide_human,
    decide_stability,
    refuse_out_of_turn,
)
from triloop.decisions import HumanDecision
from triloop.statuses import DecisionKind, Gate

BASE = {"version": "thr-9", "min_success_rate": 0.5, "max_regression_vs_production": 0.1,
        "min_samples": 10}


def spec(window: int = 5) -> ThresholdSpec:
    return ThresholdSpec.from_mapping({**BASE, "stability": {"alarm_window_iterations": window}})


def alarms(*pairs: tuple[int, str]) -> list[RecordedAlarm]:
    return [RecordedAlarm(i, k) for i, k in pairs]


def judge(recorded: list[RecordedAlarm], *, evidence: list[RecordedAlarm] | None = None,
          carried: list[RecordedAlarm] | None = None, iteration: int = 16, window: int = 5
          ) -> StabilityCheck:
    return decide_stability(
        recorded=recorded, proposal_evidence=recorded if evidence is None else evidence,
        proposal_input=recorded if carried is None else carried,
        proposed_iteration=iteration, thresholds=spec(window))


def test_stored_threshold_rows_without_the_window_get_its_default() -> None:
    old = ThresholdSpec.from_mapping(BASE)  # a row stored before the field existed
    assert old.stability == StabilitySpec() and old.stability.alarm_window_iterations == 5
    assert ThresholdSpec.from_mapping(old.to_dict()) == old  # and it round-trips
    assert spec(0).stability.alarm_window_iterations == 0
    for bad in (-1, 1.5, True, "5"):
        with pytest.raises(ThresholdSpecError, match="alarm_window_iterations"):
            spec(bad)  # type: ignore[arg-type]
    with pytest.raises(ThresholdSpecError, match="unknown fields"):
        ThresholdSpec.from_mapping({**BASE, "stability": {"window": 3}})


def test_no_alarm_or_only_old_ones_pass() -> None:
    assert judge([]).decision.verdict is Verdict.PASS
    old = judge(alarms((3, "template_collapse"), (11, "echo_trap")))
    assert old.decision.passed and not old.blocked
    assert old.decision.evidence["recorded_alarms"] == [
        {"iteration": 3, "kind": "template_collapse"}, {"iteration": 11, "kind": "echo_trap"}]


@pytest.mark.parametrize("kind", ["echo_trap", "template_collapse"])
def test_an_alarm_within_the_window_blocks_until_an_operator_overrides(kind: str) -> None:
    check = judge(alarms((12, kind)))
    decision = check.decision
    assert check.blocked and decision.verdict is Verdict.CONTINUE
    assert not decision.passed
    assert f"{kind.replace('_', ' ')} at iteration 12" in decision.reasons[0]
    assert "operator who did not submit the run may override" in decision.reasons[0]
    assert decision.evidence["blocking_alarms"] == [{"iteration": 12, "kind": kind}]
    # The proposed iteration itself counts; a window of 0 lets every alarm through.
    assert judge(alarms((16, kind))).blocked
    assert not judge(alarms((16, kind)), window=0).blocked


def test_alarms_after_the_proposed_iteration_are_not_its_own() -> None:
    later = judge(alarms((17, "echo_trap")), evidence=[], carried=[])
    assert later.decision.passed


def test_a_proposal_that_misstates_its_alarms_fails_and_cannot_be_overridden() -> None:
    recorded = alarms((15, "template_collapse"))
    cases: list[tuple[list[RecordedAlarm], list[RecordedAlarm], str]] = [
        ([], recorded, "evidence"), (recorded, [], "workflow input")]
    for evidence, carried, where in cases:
        check = judge(recorded, evidence=evidence, carried=carried)
        decision = check.decision
        assert decision.verdict is Verdict.FAIL and not check.blocked
        assert f"the proposal's {where} lists alarms []" in decision.reasons[0]
        assert "cannot be overridden" in decision.reasons[-1]
        assert decision.evidence["mismatch"] is True
    # Claiming an alarm the run never recorded is a mismatch too.
    invented = judge([], evidence=recorded, carried=recorded)
    assert invented.decision.verdict is Verdict.FAIL


def override(user: str, roles: list[str], comment: str = "checked by hand",
             decision: str = "override",
             kind: DecisionKind = DecisionKind.ALARM_OVERRIDE) -> HumanDecision:
    return HumanDecision(id="d-1", kind=kind, subject="p-1", decision=decision,
                         comment=comment, details={}, user=user, roles=tuple(roles))


def test_an_operator_overrides_with_a_reason() -> None:
    gate = decide_human(override("olga", ["operator"]), gate=Gate.STABILITY, submitter="sam")
    assert gate.passed and gate.gate == "stability"
    assert gate.evidence["user"] == "olga" and gate.evidence["comment"] == "checked by hand"


@pytest.mark.parametrize(("decision", "why"), [
    (override(" SAM", ["operator"]), "submitted the training run and cannot override"),
    (override("ada", ["auditor", "ml_engineer"]), "lacks the 'operator' role"),
    (override("olga", ["operator"], comment="  "), "needs a comment saying why"),
    (override("olga", ["operator"], decision="approve"), "unknown stability decision"),
    # An approval recorded by the operator is no override of the alarms.
    (override("olga", ["operator"], kind=DecisionKind.APPROVAL, decision="approve"),
     "unknown stability decision 'approve'"),
])
def test_override_refusals(decision: HumanDecision, why: str) -> None:
    with pytest.raises(HumanDecisionError, match=why):
        decide_human(decision, gate=Gate.STABILITY, submitter="sam")
    with pytest.raises(HumanDecisionError, match="at gate 'audit'"):
        refuse_out_of_turn(Gate.STABILITY, awaiting="audit")
