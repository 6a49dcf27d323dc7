"""The kernel's vocabulary: one word per concept, equal to the string rows and payloads hold."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.converter import DataConverter

from governance_loop.gates import GATE_ORDER as GOVERNANCE_GATE_ORDER
from triloop.statuses import (
    GATE_ORDER,
    Decision,
    DecisionKind,
    Gate,
    PromotionDecision,
    PromotionStatus,
)
from triloop.workflow_api import ErrorType, promotion_decision_update

POLICY_VOCABULARY = Path(__file__).parents[2] / "policies/triloop/authz/vocabulary.rego"


def test_one_gate_order_in_declaration_order() -> None:
    assert GOVERNANCE_GATE_ORDER is GATE_ORDER
    assert GATE_ORDER == ("stability", "offline_eval", "shadow", "canary", "audit", "approval",
                          "promote", "watch")


@pytest.mark.parametrize("decision", list(PromotionDecision))
def test_a_promotion_decision_is_read_back_from_its_row(decision: PromotionDecision) -> None:
    """What the web records (kind, verb) names the same decision when governance loads it."""
    assert PromotionDecision.recorded(decision.kind, decision.verb) is decision
    assert PromotionDecision(decision.value) is decision
    assert decision in PromotionDecision.at(decision.gate)
    assert PromotionDecision.kind_at(decision.gate) is decision.kind
    assert decision.passes is (decision.verb is not Decision.REJECT)
    assert promotion_decision_update(decision.gate)  # every human gate has an update


def test_rows_keep_their_words() -> None:
    """The database holds the verbs it always held; the pairs map one to one."""
    rows = {(d.kind.value, d.verb.value) for d in PromotionDecision}
    assert rows == {("audit", "sign"), ("audit", "reject"), ("approval", "approve"),
                    ("approval", "reject"), ("alarm_override", "override")}
    assert PromotionDecision.recorded(DecisionKind.ADMISSION, Decision.APPROVE) is None
    assert PromotionDecision.recorded(DecisionKind.APPROVAL, Decision.SIGN) is None
    with pytest.raises(ValueError, match="no person decides"):
        promotion_decision_update(Gate.CANARY)


def test_every_promotion_decision_is_a_policy_action() -> None:
    """The word is the policy's action: vocabulary.rego lists each one for promotions."""
    text = POLICY_VOCABULARY.read_text()
    for decision in PromotionDecision:
        assert re.search(rf'"{decision.value}": \{{"promotion"[^}}]*\}}', text), decision


def test_words_travel_as_their_strings() -> None:
    @dataclass
    class Carried:
        gate: Gate
        status: PromotionStatus

    assert json.dumps([Gate.AUDIT, PromotionDecision.SIGN_AUDIT]) == '["audit", "sign_audit"]'
    assert f"{Gate.AUDIT!r} {PromotionStatus.open}" == "'audit' open"
    converter = DataConverter.default.payload_converter
    payloads = converter.to_payloads([Carried(Gate.APPROVAL, PromotionStatus.promoted)])
    assert payloads[0].data == b'{"gate":"approval","status":"promoted"}'
    [back] = converter.from_payloads(payloads, [Carried])
    assert back == Carried(Gate.APPROVAL, PromotionStatus.promoted)
    assert ErrorType.DECISION_REFUSED == "DecisionRefused"
