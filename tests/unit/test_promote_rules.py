"""What promote re-checks under the alias lock, and when a routing claim stops serving."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from governance_loop.durations import CLAIM_GRACE_S, PromotionTiming
from governance_loop.gates.promote import (
    GATES_BEFORE_PROMOTE,
    PromoteFacts,
    PromoteRefused,
    RunRef,
    StoredGate,
    refuse_foreign_run,
    refuse_promote,
)
from triloop.deployment_history import revisions
from triloop.models import DeploymentHistory
from triloop.routing_claims import claim_lapsed

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
OWNER = RunRef(workflow_id="promotion-p1", run_id="run-1")


def passed_gates(at: datetime = T0) -> list[StoredGate]:
    return [StoredGate(gate=g.value, passed=True, created_at=at + timedelta(minutes=i))
            for i, g in enumerate(GATES_BEFORE_PROMOTE)]


def history(*moves: tuple[str, str, datetime]) -> list[DeploymentHistory]:
    rows, previous = [], None
    for index, (kind, checkpoint, at) in enumerate(moves, start=1):
        rows.append(DeploymentHistory(id=index, alias="production", checkpoint_id=checkpoint,
                                      previous_checkpoint_id=previous, kind=kind, reason=kind,
                                      actor="x", created_at=at))
        previous = checkpoint
    return rows


def facts(**changes: object) -> PromoteFacts:
    base = PromoteFacts(
        promotion_id="p1", status="open", owner=OWNER, caller=OWNER,
        candidate_checkpoint_id="cand", gates=passed_gates(),
        history=revisions(history(("bootstrap", "base", T0 - timedelta(days=1)))),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def rule_of(checked: PromoteFacts) -> str:
    with pytest.raises(PromoteRefused) as refused:
        refuse_promote(checked)
    return refused.value.rule


def test_the_run_that_opened_an_open_promotion_that_passed_every_gate_may_promote() -> None:
    refuse_promote(facts())
    refuse_promote(facts(caller=None))  # outside a workflow (the CLI, a test): no run to match


def test_a_reset_run_is_refused_first_and_says_the_way_out() -> None:
    reset = RunRef(workflow_id="promotion-p1", run_id="run-2")
    with pytest.raises(PromoteRefused) as refused:
        refuse_promote(facts(caller=reset, status="rolled_back"))
    assert refused.value.rule == "promotion_run"
    assert "run-1" in str(refused.value) and "run-2" in str(refused.value)
    assert "propose the candidate again" in str(refused.value)
    other = RunRef(workflow_id="promotion-p2", run_id="run-1")
    assert rule_of(facts(caller=other)) == "promotion_run"


def test_a_row_opened_before_runs_were_recorded_names_only_its_workflow() -> None:
    legacy = RunRef(workflow_id="promotion-p1", run_id=None)
    refuse_foreign_run("p1", owner=legacy, caller=RunRef("promotion-p1", "any"))
    with pytest.raises(PromoteRefused):
        refuse_foreign_run("p1", owner=legacy, caller=RunRef("promotion-other", "any"))


@pytest.mark.parametrize("status", ["rolled_back", "rejected", "promoted", "terminated"])
def test_an_ended_promotion_never_moves_production(status: str) -> None:
    assert rule_of(facts(status=status)) == "promotion_ended"


def test_every_gate_before_promote_needs_a_pass_and_no_failure() -> None:
    gates = passed_gates()
    for missing in GATES_BEFORE_PROMOTE:
        without = [g for g in gates if g.gate != missing]
        with pytest.raises(PromoteRefused, match=f"no passing result for {missing}"):
            refuse_promote(facts(gates=without))
    failed = [*gates, StoredGate(gate="canary", passed=False, created_at=T0)]
    with pytest.raises(PromoteRefused, match="failed at canary"):
        refuse_promote(facts(gates=failed))


def test_a_candidate_rolled_back_after_its_gates_judged_it_is_refused() -> None:
    after = revisions(history(("bootstrap", "base", T0 - timedelta(days=1)),
                              ("promote", "cand", T0 + timedelta(hours=1)),
                              ("rollback", "base", T0 + timedelta(hours=2))))
    with pytest.raises(PromoteRefused) as refused:
        refuse_promote(facts(history=after))
    assert refused.value.rule == "rolled_back" and "revision 3" in str(refused.value)


def test_a_rollback_before_the_gates_judged_it_again_does_not_count() -> None:
    # An earlier promotion of the same checkpoint was rolled back; this one judged it anew.
    before = revisions(history(("bootstrap", "base", T0 - timedelta(days=3)),
                               ("promote", "cand", T0 - timedelta(days=2)),
                               ("rollback", "base", T0 - timedelta(days=1))))
    refuse_promote(facts(history=before))


def test_a_claim_serves_only_while_its_promotion_is_open_and_unexpired() -> None:
    def lapsed(**changes: object) -> str | None:
        claim: dict[str, object] = {
            "slot": "shadow", "checkpoint_id": "cand", "promotion_id": "p1",
            "promotion_status": "open", "expires_at": T0 + timedelta(hours=1), "now": T0}
        return claim_lapsed(**{**claim, **changes})  # type: ignore[arg-type]

    assert lapsed() is None
    assert "ended rolled_back" in (lapsed(promotion_status="rolled_back") or "")
    assert "does not exist" in (lapsed(promotion_status=None) or "")
    assert "expired" in (lapsed(now=T0 + timedelta(hours=1)) or "")
    # Production, an empty slot and a trial routed by hand (no promotion) serve as stored.
    assert lapsed(slot="production", promotion_status="promoted") is None
    assert lapsed(checkpoint_id=None, promotion_status="rejected") is None
    assert lapsed(promotion_id=None, promotion_status=None, expires_at=None) is None


def test_a_claim_outlives_its_soak_by_the_grace_only() -> None:
    timing = PromotionTiming(shadow_soak_s=100.0, canary_soak_s=200.0,
                             canary_check_interval_s=10.0)
    assert timing.claim_s("shadow") == 100.0 + CLAIM_GRACE_S
    assert timing.claim_s("canary") == 200.0 + CLAIM_GRACE_S
