# ruff: noqa: F811  (tests take the imported ``deps`` fixture as an argument of that name)
"""The stability gate on the real Temporal, PostgreSQL and OPA: alarms block a candidate.

The candidate's run recorded template-collapse alarms near the proposed iteration (as the
learning loop stores them: ``training_step.alarms``, and the proposal's copies). Promotion
refuses it unless an operator who did not submit the run overrides, with a reason,
through a recorded human decision; every refusal names its rule and is audited.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import WorkflowUpdateFailedError

from tests.integration.test_promotion_workflow import (  # noqa: F401  (the fixtures)
    TIMING,
    Deps,
    _gates,
    _good,
    _production,
    _rows,
    authorizer,
    deps,
    gov_settings,
    running,
)
from triloop.workflow_api import (
    PROMOTION_APPROVE_UPDATE,
    PROMOTION_OVERRIDE_ALARMS_UPDATE,
    StabilityAlarm,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ITERATION = 8
ALARMS = [StabilityAlarm(6, "template_collapse"), StabilityAlarm(8, "template_collapse")]


def alarmed_run(deps: Deps, recorded: list[StabilityAlarm] = ALARMS,
                proposal_lists: list[StabilityAlarm] = ALARMS) -> None:
    """The world's run recorded these alarms; its proposal (iteration 8) lists its copies."""
    with deps.owner.begin() as conn:
        for iteration in range(1, ITERATION + 1):
            kinds = [a.kind for a in recorded if a.iteration == iteration]
            conn.execute(text(
                "INSERT INTO training_step (run_id, iteration, alarms, length_stats, metrics)"
                " VALUES (:r, :i, :a, '{}', '{}')"),
                {"r": deps.world.run_id, "i": iteration, "a": kinds})
        conn.execute(text("UPDATE proposal SET evidence = CAST(:e AS jsonb) WHERE id = :p"), {
            "p": deps.world.proposal_id,
            "e": json.dumps({"iteration": ITERATION, "stability_alarms": [
                {"iteration": a.iteration, "kind": a.kind} for a in proposal_lists]})})


def _denials(deps: Deps) -> list[str]:
    rows = _rows(deps.owner, "SELECT payload->'reasons'->>0 FROM audit_event WHERE decision ="
                 " 'deny' AND resource->>'id' = (SELECT id FROM promotion WHERE proposal_id ="
                 " :p)", p=deps.world.proposal_id)
    return [str(r[0]) for r in rows]


async def test_alarmed_candidate_is_refused_without_an_override(deps: Deps) -> None:
    alarmed_run(deps)
    async with running(deps, _good(deps), replace(TIMING, approval_deadline_s=3.0),
                       alarms=ALARMS) as run:
        waiting = await run.at_gate("stability")
        assert waiting.status == "open", waiting.reason
        assert waiting.waiting_for == "operator (override of stability alarms)"
        assert "template collapse at iteration 6, template collapse at iteration 8" in (
            waiting.reason or "")
        # The next gates do not open while it waits: nothing can approve past it.
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await run.decide(PROMOTION_APPROVE_UPDATE, "carol", ["operator"])
        assert "at gate 'stability'" in str(refused.value.cause)
        final = await run.result()
    assert final.status == "rejected" and final.current_gate == "stability", final.reason
    assert "no operator overrode the alarms" in (final.reason or "")
    gates = _gates(deps)
    assert list(gates) == ["stability"] and not gates["stability"][1]
    assert _production(deps)[0] == deps.world.baseline


async def test_override_refusals_then_an_operator_overrides(deps: Deps) -> None:
    alarmed_run(deps)
    async with running(deps, _good(deps), alarms=ALARMS) as run:
        await run.at_gate("stability")

        async def override(user: str, roles: list[str]) -> Any:
            name = deps.person(user, roles)
            return await run.send(PROMOTION_OVERRIDE_ALARMS_UPDATE,
                                  deps.decide("alarm_override", name, "override"))

        for user, roles, why in [
            (deps.world.submitter, ["operator"], "submitted the training run and cannot override"),
            ("ada", ["auditor", "ml_engineer"], "does not hold the 'operator' role"),
            ("erin", ["operator", "admin"], "admins manage users and may never override_alarms"),
        ]:
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await override(user, roles)
            assert why in str(refused.value.cause), refused.value.cause
        denied = _denials(deps)
        for why in ("submitted the training run", "does not hold the 'operator' role",
                    "may never override_alarms"):
            assert any(why in d for d in denied), denied
        # An approval decision cannot be replayed as an override.
        carol = deps.person("carol", ["operator"])
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await run.send(PROMOTION_OVERRIDE_ALARMS_UPDATE,
                           deps.decide("approval", carol, "approve"))
        assert "this needs kind 'alarm_override'" in str(refused.value.cause)

        summary = await override("carol", ["operator"])
        assert summary["passed"] and summary["gate"] == "stability"
        assert f"carol-{deps.suffix} decided override" in summary["reasons"][0]
        # Past the alarms the candidate still walks every other gate.
        status = await run.at_gate("audit")
        assert status.status == "open", status.reason
        assert [g.gate for g in status.results] == ["stability", "offline_eval", "shadow",
                                                    "canary"]
        with pytest.raises(WorkflowUpdateFailedError) as refused:  # nothing left to override
            await override("dan", ["operator"])
        assert "at gate 'audit'" in str(refused.value.cause)
    evidence = _rows(deps.owner, "SELECT g.passed, g.evidence FROM gate_result g JOIN promotion"
                     " p ON p.id = g.promotion_id WHERE p.proposal_id = :p AND g.gate ="
                     " 'stability'", p=deps.world.proposal_id)
    assert len(evidence) == 1 and evidence[0][0]
    recorded = evidence[0][1]
    assert recorded["overridden"] is True and recorded["user"] == f"carol-{deps.suffix}"
    assert recorded["comment"] == f"carol-{deps.suffix} checked the evidence"
    assert recorded["recorded_alarms"] == [{"iteration": a.iteration, "kind": a.kind}
                                           for a in ALARMS]
    allowed = _rows(deps.owner, "SELECT count(*) FROM audit_event WHERE action ="
                    " 'override_alarms' AND decision = 'allow' AND"
                    " payload->'context'->'on_behalf_of'->>'user' = :u",
                    u=f"carol-{deps.suffix}")
    assert allowed[0][0] == 1


async def test_a_proposal_that_hides_its_alarms_is_refused_outright(deps: Deps) -> None:
    # The run recorded the alarms; the proposal and its workflow input claim none.
    alarmed_run(deps, proposal_lists=[])
    async with running(deps, _good(deps), alarms=[]) as run:
        final = await run.result()
    assert final.status == "rejected" and final.current_gate == "stability", final.reason
    assert "the proposal's evidence lists alarms []" in (final.reason or "")
    assert "cannot be overridden" in (final.reason or "")
    assert list(_gates(deps)) == ["stability"]


async def test_alarms_older_than_the_window_let_the_candidate_through(deps: Deps) -> None:
    old = [StabilityAlarm(2, "echo_trap")]  # window 5 before iteration 8: iterations 4..8
    alarmed_run(deps, recorded=old, proposal_lists=old)
    async with running(deps, _good(deps), alarms=old) as run:
        status = await run.at_gate("audit")
    assert status.status == "open" and status.results[0].gate == "stability", status.reason
    assert status.results[0].passed, status.results[0].reasons
