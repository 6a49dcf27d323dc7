"""Promotion decisions: sent to governance as Temporal updates only after the policy allowed them.

Refusals are checked on promotions whose workflow is not running: had the web
service reached Temporal, the answer would be a 409 "not running", so a 403 or
422 shows it refused first. The happy paths run against a stand-in promotion
workflow (the real name, this test's governance queue) that records each
decision and writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import Engine, text
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.factories_web import (
    Person,
    SeededPromotion,
    add_approval,
    assert_problem,
    make_promotion,
    make_user,
)
from tests.temporal_helpers import terminate_as_operator
from triloop.config import Settings
from triloop.temporal import connect
from triloop.workflow_api import (
    GOVERNANCE_QUEUE,
    PROMOTION_APPROVE_UPDATE,
    PROMOTION_OVERRIDE_ALARMS_UPDATE,
    PROMOTION_SIGN_AUDIT_UPDATE,
    PROMOTION_STATUS_QUERY,
    PROMOTION_WORKFLOW,
    DecisionRef,
    ErrorType,
    GateSummary,
    PromotionInput,
)

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@workflow.defn(name=PROMOTION_WORKFLOW)
class StandInPromotion:
    """Records the decision ids it is sent; refuses every decision when started to refuse.

    Started for ``refuse-me``, its validator refuses (a ``ValueError``); for an
    ``ErrorType`` value, the update fails with an error of that type, as governance's
    activity refusals do.
    """

    def __init__(self) -> None:
        self.decisions: list[dict[str, Any]] = []
        self.done = False
        self.refuse = False
        self.fail_as: str | None = None

    @workflow.run
    async def run(self, candidate: PromotionInput) -> None:
        self.refuse = candidate.submitted_by == "refuse-me"
        if candidate.submitted_by in set(ErrorType):
            self.fail_as = candidate.submitted_by
        await workflow.wait_condition(lambda: self.done)

    def _record(self, kind: str, decision: DecisionRef) -> GateSummary:
        if self.fail_as is not None:  # worded so that no text says what refused
            raise ApplicationError("refused: the rules say no", ["because"],
                                   type=self.fail_as, non_retryable=True)
        self.decisions.append({"kind": kind, "decision_id": decision.decision_id})
        return GateSummary(gate=kind, passed=True, verdict="pass", reasons=[f"recorded {kind}"])

    def _check(self) -> None:
        if self.refuse:
            raise ValueError("separation of duties re-checked by governance: refused")

    @workflow.update(name=PROMOTION_SIGN_AUDIT_UPDATE)
    def sign_audit(self, decision: DecisionRef) -> GateSummary:
        return self._record("audit", decision)

    @sign_audit.validator
    def _check_audit(self, decision: DecisionRef) -> None:
        self._check()

    @workflow.update(name=PROMOTION_APPROVE_UPDATE)
    def operator_decision(self, decision: DecisionRef) -> GateSummary:
        summary = self._record("operator", decision)
        self.done = True
        return summary

    @operator_decision.validator
    def _check_operator(self, decision: DecisionRef) -> None:
        self._check()

    @workflow.update(name=PROMOTION_OVERRIDE_ALARMS_UPDATE)
    def override_alarms(self, decision: DecisionRef) -> GateSummary:
        summary = self._record("alarm_override", decision)
        self.done = True
        return summary

    @override_alarms.validator
    def _check_override(self, decision: DecisionRef) -> None:
        self._check()

    @workflow.query(name=PROMOTION_STATUS_QUERY)
    def status(self) -> list[dict[str, Any]]:
        return self.decisions


def recorded(engine: Engine, decision_id: str) -> dict[str, Any]:
    """The human_decision row an update named: what governance would read."""
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT kind, subject, decision, user_name, comment, recorded_by "
            "FROM human_decision WHERE id = :i"), {"i": decision_id}).mappings().one()
    return dict(row)


@pytest_asyncio.fixture(loop_scope="session")
async def governance(web_settings: Settings) -> AsyncIterator[Client]:
    client = await connect(web_settings, identity="test-governance-stand-in", service="governance")
    async with Worker(client, task_queue=web_settings.task_queue(GOVERNANCE_QUEUE),
                      workflows=[StandInPromotion],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        yield client


async def _start(client: Client, settings: Settings, seeded: SeededPromotion,
                 submitted_by: str = "x") -> WorkflowHandle:
    return await client.start_workflow(
        PROMOTION_WORKFLOW,
        PromotionInput(proposal_id="p", checkpoint_id=seeded.checkpoint_id,
                       run_id=seeded.run_id, submitted_by=submitted_by),
        id=seeded.workflow_id, task_queue=settings.task_queue(GOVERNANCE_QUEUE),
    )


async def test_auditor_signs_then_operator_approves(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    governance: Client, web_settings: Settings,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            current_gate="audit")
    handle = await _start(governance, web_settings, seeded)
    auditor, operator = people["auditor"], people["operator"]
    signed = await api.post(f"/api/promotions/{seeded.promotion_id}/sign-audit",
                            json={"comment": "lineage and evidence checked"},
                            headers=auditor.headers)
    assert signed.status_code == 200, signed.text
    assert signed.json()["result"] == {"gate": "audit", "passed": True, "verdict": "pass",
                                       "reasons": ["recorded audit"], "gate_result_id": None}
    # Governance records the sign-off; seeded here as it would have written it.
    add_approval(owner_engine, seeded.promotion_id, "audit", auditor.name)
    approved = await api.post(f"/api/promotions/{seeded.promotion_id}/approve",
                              json={"comment": "gates green, ship it"}, headers=operator.headers)
    assert approved.status_code == 200, approved.text
    assert approved.json()["user"] == operator.name
    await handle.result()
    # The updates carried decision ids only; the rows they name say who decided, written by
    # the web role (the database filled in recorded_by).
    sent = await handle.query(PROMOTION_STATUS_QUERY)
    assert [d["kind"] for d in sent] == ["audit", "operator"]
    assert all(set(d) == {"kind", "decision_id"} for d in sent)
    assert [recorded(owner_engine, d["decision_id"]) for d in sent] == [
        {"kind": "audit", "subject": seeded.promotion_id, "decision": "sign",
         "user_name": auditor.name, "comment": "lineage and evidence checked",
         "recorded_by": "triloop_web"},
        {"kind": "approval", "subject": seeded.promotion_id, "decision": "approve",
         "user_name": operator.name, "comment": "gates green, ship it",
         "recorded_by": "triloop_web"},
    ]


async def test_operator_rejects_with_comment(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    governance: Client, web_settings: Settings,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    handle = await _start(governance, web_settings, seeded)
    add_approval(owner_engine, seeded.promotion_id, "audit", people["auditor"].name)
    rejected = await api.post(f"/api/promotions/{seeded.promotion_id}/reject",
                              json={"comment": "canary too small"},
                              headers=people["operator"].headers)
    assert rejected.status_code == 200, rejected.text
    await handle.result()
    [sent] = await handle.query(PROMOTION_STATUS_QUERY)
    row = recorded(owner_engine, sent["decision_id"])
    assert (row["decision"], row["comment"]) == ("reject", "canary too small")


async def test_workflow_validator_refusal_is_409(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    governance: Client, web_settings: Settings,
) -> None:
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    handle = await _start(governance, web_settings, seeded, submitted_by="refuse-me")
    add_approval(owner_engine, seeded.promotion_id, "audit", people["auditor"].name)
    response = await api.post(f"/api/promotions/{seeded.promotion_id}/approve",
                              json={"comment": "looks fine"}, headers=people["operator"].headers)
    assert_problem(response, 409, "re-checked by governance")
    assert await handle.query(PROMOTION_STATUS_QUERY) == []
    await terminate_as_operator(web_settings, handle)


@pytest.mark.parametrize(("error_type", "status"), [
    (ErrorType.DECISION_REFUSED, 403), (ErrorType.POLICY_DENIED, 403),
    (ErrorType.POLICY_UNAVAILABLE, 503), (ErrorType.INVALID_REQUEST, 422),
    (ErrorType.GOVERNANCE_REFUSED, 409), (ErrorType.PROMOTION_ENDED, 409),
])
async def test_a_refused_update_is_answered_by_its_error_type(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    governance: Client, web_settings: Settings, error_type: ErrorType, status: int,
) -> None:
    """Governance's refusal reaches the person with the status its type calls for; the
    message is the same for every type, so nothing is read from the text."""
    seeded = make_promotion(owner_engine, submitted_by=people["engineer"].name)
    handle = await _start(governance, web_settings, seeded, submitted_by=error_type)
    add_approval(owner_engine, seeded.promotion_id, "audit", people["auditor"].name)
    response = await api.post(f"/api/promotions/{seeded.promotion_id}/approve",
                              json={"comment": "looks fine"}, headers=people["operator"].headers)
    assert_problem(response, status, "the rules say no")
    assert await handle.query(PROMOTION_STATUS_QUERY) == []
    await terminate_as_operator(web_settings, handle)


# ---- refusals: none of these reach Temporal (no workflow runs for these promotions) ----


def _seed(engine: Engine, submitter: str, gate: str = "approval") -> SeededPromotion:
    return make_promotion(engine, submitted_by=submitter, current_gate=gate)


async def _decide(api: httpx.AsyncClient, who: Person, promotion: str, action: str,
                  comment: str | None = "because") -> httpx.Response:
    body = {} if comment is None else {"comment": comment}
    return await api.post(f"/api/promotions/{promotion}/{action}", json=body,
                          headers=who.headers)


async def test_submitter_can_neither_audit_nor_approve(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    everything = make_user(owner_engine, "ml_engineer", "operator", "auditor")
    seeded = _seed(owner_engine, everything.name)
    add_approval(owner_engine, seeded.promotion_id, "audit", people["auditor"].name)
    for action in ("approve", "sign-audit"):
        response = await _decide(api, everything, seeded.promotion_id, action)
        assert_problem(response, 403, "separation of duties", "submitted the run")


async def test_auditor_who_signed_cannot_approve(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    both = people["auditor_operator"]
    seeded = _seed(owner_engine, people["engineer"].name)
    add_approval(owner_engine, seeded.promotion_id, "audit", both.name)
    response = await _decide(api, both, seeded.promotion_id, "approve")
    assert_problem(response, 403, "signed the audit and may not also approve")


async def test_approval_needs_a_signed_audit(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    seeded = _seed(owner_engine, people["engineer"].name)
    response = await _decide(api, people["operator"], seeded.promotion_id, "approve")
    assert_problem(response, 403, "needs a signed audit")


@pytest.mark.parametrize(("who", "action"), [
    ("auditor", "approve"), ("auditor", "reject"), ("operator", "sign-audit"),
    ("operator", "reject-audit"), ("engineer2", "approve"), ("engineer2", "sign-audit"),
    ("admin", "approve"),
])
async def test_wrong_role_is_403(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person], who: str,
    action: str,
) -> None:
    seeded = _seed(owner_engine, people["engineer"].name)
    add_approval(owner_engine, seeded.promotion_id, "audit", people["auditor_operator"].name)
    assert_problem(await _decide(api, people[who], seeded.promotion_id, action), 403)


@pytest.mark.parametrize("comment", [None, "", "   \n "])
async def test_a_comment_is_required(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person],
    comment: str | None,
) -> None:
    seeded = _seed(owner_engine, people["engineer"].name)
    add_approval(owner_engine, seeded.promotion_id, "audit", people["auditor"].name)
    response = await _decide(api, people["operator"], seeded.promotion_id, "approve", comment)
    assert_problem(response, 422, "comment")


async def test_state_refusals(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    operator = people["operator"]
    assert_problem(await _decide(api, operator, "nope", "approve"), 404)
    closed = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            status="promoted")
    add_approval(owner_engine, closed.promotion_id, "audit", people["auditor"].name)
    assert_problem(await _decide(api, operator, closed.promotion_id, "approve"), 409, "promoted")
    orphan = make_promotion(owner_engine, submitted_by=people["engineer"].name,
                            with_workflow=False)
    add_approval(owner_engine, orphan.promotion_id, "audit", people["auditor"].name)
    assert_problem(await _decide(api, operator, orphan.promotion_id, "approve"), 409,
                   "no workflow")
    # Allowed and open, but governance's workflow is gone: Temporal says so, a 409.
    gone = _seed(owner_engine, people["engineer"].name)
    add_approval(owner_engine, gone.promotion_id, "audit", people["auditor"].name)
    assert_problem(await _decide(api, operator, gone.promotion_id, "approve"), 409,
                   "not running")


# ---- the stability gate: alarms on the promotion, an operator's override ----


def _alarmed(engine: Engine, seeded: SeededPromotion) -> None:
    """The run recorded template collapse at iterations 9 and 10 (the candidate's)."""
    with engine.begin() as conn:
        for iteration in (9, 10, 11):  # 11 came after the proposal: not the candidate's
            conn.execute(text(
                "INSERT INTO training_step (run_id, iteration, alarms, length_stats, metrics)"
                " VALUES (:r, :i, '{template_collapse}', '{}', CAST(:m AS jsonb))"),
                {"r": seeded.run_id, "i": iteration,
                 "m": json.dumps({"alarms": [{
                     "kind": "template_collapse", "iteration": iteration,
                     "message": "retrieval accuracy near chance", "evidence": {}}]})})
        conn.execute(text("UPDATE proposal SET evidence = '{\"iteration\": 10}' WHERE id ="
                          " (SELECT proposal_id FROM promotion WHERE id = :p)"),
                     {"p": seeded.promotion_id})


async def test_a_promotion_shows_its_candidates_alarms(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    seeded = _seed(owner_engine, people["engineer"].name, gate="stability")
    _alarmed(owner_engine, seeded)
    found = await api.get(f"/api/promotions/{seeded.promotion_id}",
                          headers=people["operator"].headers)
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["proposed_iteration"] == 10
    assert body["alarms"] == [
        {"iteration": i, "kind": "template_collapse", "message": "retrieval accuracy near chance"}
        for i in (9, 10)]


async def test_an_operator_overrides_the_alarms_with_a_reason(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    governance: Client, web_settings: Settings,
) -> None:
    seeded = _seed(owner_engine, people["engineer"].name, gate="stability")
    handle = await _start(governance, web_settings, seeded)
    response = await _decide(api, people["operator"], seeded.promotion_id, "override-alarms",
                             "collapse alarms are a known artefact of this tiny task")
    assert response.status_code == 200, response.text
    await handle.result()
    [sent] = await handle.query(PROMOTION_STATUS_QUERY)
    assert recorded(owner_engine, sent["decision_id"]) == {
        "kind": "alarm_override", "subject": seeded.promotion_id, "decision": "override",
        "user_name": people["operator"].name,
        "comment": "collapse alarms are a known artefact of this tiny task",
        "recorded_by": "triloop_web"}


async def test_override_refusals_never_reach_governance(
    api: httpx.AsyncClient, owner_engine: Engine, people: dict[str, Person]
) -> None:
    everything = make_user(owner_engine, "ml_engineer", "operator", "auditor")
    seeded = _seed(owner_engine, everything.name, gate="stability")
    assert_problem(await _decide(api, everything, seeded.promotion_id, "override-alarms"), 403,
                   "separation of duties", "submitted the run")
    others = _seed(owner_engine, people["engineer"].name, gate="stability")
    for who in ("auditor", "engineer2"):
        assert_problem(await _decide(api, people[who], others.promotion_id, "override-alarms"),
                       403)
    assert_problem(await _decide(api, people["admin"], others.promotion_id, "override-alarms"),
                   403)
    assert_problem(await _decide(api, people["operator"], others.promotion_id,
                                 "override-alarms", "  "), 422, "comment")
    with owner_engine.connect() as conn:
        written = conn.execute(text("SELECT count(*) FROM human_decision WHERE subject = ANY(:s)"),
                               {"s": [seeded.promotion_id, others.promotion_id]}).scalar_one()
    assert written == 0


async def test_a_refused_override_is_a_refusal_on_the_persons_own_row(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    governance: Client, web_settings: Settings,
) -> None:
    """Issue 32, route 8: the policy allowed the override, governance refused it. The log
    shows the operator's own ``deny`` with the reason, not an ``allow`` with no outcome."""
    seeded = _seed(owner_engine, people["engineer"].name, gate="stability")
    handle = await _start(governance, web_settings, seeded,
                          submitted_by=ErrorType.DECISION_REFUSED)
    response = await _decide(api, people["operator"], seeded.promotion_id, "override-alarms",
                             "the alarms are an artefact")
    problem = assert_problem(response, 403, "the rules say no")
    # People's words: the decision they took, not the Temporal workflow behind it (issue 28).
    assert seeded.workflow_id not in problem["detail"] and "stability decision" in problem["detail"]
    with owner_engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT decision, actor->>'user', payload FROM audit_event WHERE action ="
            " 'override_alarms' AND resource->>'id' = :p ORDER BY seq"),
            {"p": seeded.promotion_id}).all()
    assert [(r[0], r[1]) for r in rows] == [("allow", people["operator"].name),
                                            ("deny", people["operator"].name)]
    refusal = rows[1][2]
    assert refusal["outcome"] == "refused" and "the rules say no" in refusal["reasons"][0]
    listed = await api.get("/api/audit/events", params={"actor": people["operator"].name},
                           headers=people["auditor"].headers)
    assert listed.status_code == 200, listed.text
    allowed = [e for e in listed.json()["items"] if e["action"] == "override_alarms"
               and e["decision"] == "allow"]
    assert allowed and allowed[0]["outcome"] == "refused", allowed
    await terminate_as_operator(web_settings, handle)
