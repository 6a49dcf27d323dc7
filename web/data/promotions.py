"""Promotions with their gate timeline, evidence against thresholds, and human decisions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session, col, select

from triloop.decisions import role_active_since
from triloop.models import (
    Approval,
    EvalSet,
    GateResult,
    Promotion,
    Proposal,
    Threshold,
    TrainingStep,
    User,
)
from triloop.statuses import GATE_ORDER, Decision, PromotionDecision
from web.data.gate_traffic import TrafficProgress, traffic_progress
from web.pagination import Page, keyset, page_of


class PromotionSummary(BaseModel):
    """A candidate's way through the gates."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    proposal_id: str
    checkpoint_id: str
    run_id: str
    submitted_by: str
    baseline_checkpoint_id: str | None = None
    workflow_id: str | None = None
    status: str
    current_gate: str | None = None
    status_reason: str | None = None
    created_at: datetime
    updated_at: datetime | None = None


class GateView(BaseModel):
    """One gate verdict with its evidence, the threshold it was held to and the eval set."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    gate: str
    passed: bool
    reasons: list[str]
    evidence: dict[str, Any]
    threshold_id: str | None = None
    threshold_spec: dict[str, Any] | None = None
    eval_set_id: str | None = None
    eval_set_name: str | None = None
    eval_set_hash: str | None = None
    created_at: datetime


class ApprovalPublic(BaseModel):
    """An auditor's sign-off or an operator's decision."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    kind: str
    decision: str
    user_name: str
    comment: str
    created_at: datetime


class CandidateAlarm(BaseModel):
    """A stability alarm the candidate's run recorded, up to the proposed iteration."""

    iteration: int
    kind: str = Field(description="echo_trap | template_collapse")
    message: str = ""


class PromotionDetail(PromotionSummary):
    """A promotion with its gates; approvals (and alarms) are null for roles that may not
    read them."""

    gates: list[GateView]
    proposed_iteration: int | None = Field(
        default=None, description="the run's iteration that made the candidate")
    alarms: list[CandidateAlarm] | None = Field(
        default=None, description="the run's stability alarms up to the proposed iteration")
    approvals: list[ApprovalPublic] | None = None
    audited_by: str | None = Field(default=None, description="who signed the audit, if anyone")
    traffic: TrafficProgress | None = Field(
        default=None, description="an open shadow or canary gate's production traffic so far "
        "against its min_samples; null at any other gate")


class DecisionFacts(BaseModel):
    """What the policy needs to check duties on a promotion, and the role age of a person."""

    promotion: PromotionSummary
    audited_by: str | None = None
    approved_by: str | None = None
    role_since: dict[str, datetime] = Field(
        default_factory=dict, description="when each deciding role the person holds became"
        " active (read for ``decision_facts(user=...)``; empty otherwise)")

    def policy_attrs(self, decision: PromotionDecision | None = None) -> dict[str, str]:
        """The duty facts the policy needs about the promotion; for ``decision``, also when
        the promotion opened and when the person's role for it became active
        (``policies/triloop/authz/role_age.rego``: a role must predate the promotion)."""
        attrs = {"submitted_by": self.promotion.submitted_by}
        if self.audited_by:
            attrs["audited_by"] = self.audited_by
        if decision is not None:
            attrs["promotion_opened_at"] = rfc3339(self.promotion.created_at)
            since = self.role_since.get(decision.role)
            if since is not None:
                attrs["role_since"] = rfc3339(since)
        return attrs


def rfc3339(moment: datetime) -> str:
    """A timestamp as the policy parses it (``time.parse_rfc3339_ns``), in UTC."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def list_promotions(
    *, session: Session, limit: int, cursor: str | None, status: str | None = None,
    checkpoint_id: str | None = None, id_prefix: str | None = None,
) -> Page[PromotionSummary]:
    """Promotions, newest first, optionally by status, candidate or id prefix."""
    statement = select(Promotion)
    if id_prefix is not None:
        statement = statement.where(col(Promotion.id).startswith(id_prefix, autoescape=True))
    if status is not None:
        statement = statement.where(Promotion.status == status)
    if checkpoint_id is not None:
        statement = statement.where(Promotion.checkpoint_id == checkpoint_id)
    statement = keyset(statement, [col(Promotion.created_at), col(Promotion.id)], cursor,
                       (datetime, str), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda p: (p.created_at, p.id), PromotionSummary.model_validate)


def _approvals(session: Session, promotion_id: str) -> list[Approval]:
    return list(session.exec(
        select(Approval).where(Approval.promotion_id == promotion_id)
        .order_by(col(Approval.created_at))
    ))


def _signer(approvals: list[Approval], kind: str) -> str | None:
    # Governance records an audit sign-off as "approve" (the wire word) or "sign".
    signed = [a.user_name for a in approvals
              if a.kind == kind and a.decision in (Decision.APPROVE, Decision.SIGN)]
    return signed[-1] if signed else None


def decision_facts(
    *, session: Session, promotion_id: str, user: str | None = None
) -> DecisionFacts | None:
    """The promotion and who audited/approved it so far; with ``user``, when each deciding
    role they hold became active (``triloop.decisions.role_active_since``, as governance
    reads it)."""
    row = session.get(Promotion, promotion_id)
    if row is None:
        return None
    approvals = _approvals(session, promotion_id)
    person = session.get(User, user) if user is not None else None
    deciding = {d.role for d in PromotionDecision}
    role_since = {} if person is None else {
        role: role_active_since(session, user=person, role=role)
        for role in person.roles if role in deciding}
    return DecisionFacts(
        promotion=PromotionSummary.model_validate(row),
        audited_by=_signer(approvals, "audit"), approved_by=_signer(approvals, "operator"),
        role_since=role_since,
    )


def candidate_alarms(*, session: Session, run_id: str, up_to: int | None
                     ) -> list[CandidateAlarm]:
    """The run's recorded alarms (``training_step``) up to an iteration, oldest first."""
    statement = select(TrainingStep).where(TrainingStep.run_id == run_id)
    if up_to is not None:
        statement = statement.where(col(TrainingStep.iteration) <= up_to)
    alarms = []
    for step in session.exec(statement.order_by(col(TrainingStep.iteration))):
        for alarm in (step.metrics or {}).get("alarms") or []:
            alarms.append(CandidateAlarm(iteration=step.iteration, kind=str(alarm["kind"]),
                                         message=str(alarm.get("message") or "")))
    return alarms


def promotion_detail(
    *, session: Session, promotion_id: str, with_approvals: bool, with_alarms: bool = False,
) -> PromotionDetail | None:
    """The promotion with its gate timeline in gate order, and approvals when allowed."""
    row = session.get(Promotion, promotion_id)
    if row is None:
        return None
    results = list(session.exec(
        select(GateResult).where(GateResult.promotion_id == promotion_id)
        .order_by(col(GateResult.created_at))
    ))
    thresholds = {t.id: t for t in session.exec(select(Threshold).where(
        col(Threshold.id).in_({g.threshold_id for g in results if g.threshold_id})))}
    eval_sets = {e.id: e for e in session.exec(select(EvalSet).where(
        col(EvalSet.id).in_({g.eval_set_id for g in results if g.eval_set_id})))}
    gates = [_gate(g, thresholds, eval_sets) for g in results]
    gates.sort(key=lambda g: (_gate_rank(g.gate), g.created_at))
    approvals = _approvals(session, promotion_id)
    proposal = session.get(Proposal, row.proposal_id)
    named = (proposal.evidence or {}).get("iteration") if proposal is not None else None
    iteration = named if isinstance(named, int) else None
    return PromotionDetail(
        **PromotionSummary.model_validate(row).model_dump(),
        gates=gates, proposed_iteration=iteration,
        alarms=candidate_alarms(session=session, run_id=row.run_id, up_to=iteration)
        if with_alarms else None,
        approvals=[ApprovalPublic.model_validate(a) for a in approvals] if with_approvals else None,
        audited_by=_signer(approvals, "audit") if with_approvals else None,
        traffic=traffic_progress(session=session, promotion=row),
    )


def _gate_rank(gate: str) -> int:
    return GATE_ORDER.index(gate) if gate in GATE_ORDER else len(GATE_ORDER)


def _gate(
    result: GateResult, thresholds: dict[str, Threshold], eval_sets: dict[str, EvalSet]
) -> GateView:
    threshold = thresholds.get(result.threshold_id or "")
    eval_set = eval_sets.get(result.eval_set_id or "")
    return GateView(
        id=result.id, gate=result.gate, passed=result.passed, reasons=list(result.reasons),
        evidence=result.evidence, threshold_id=result.threshold_id,
        threshold_spec=None if threshold is None else threshold.spec,
        eval_set_id=result.eval_set_id,
        eval_set_name=None if eval_set is None else f"{eval_set.name} v{eval_set.version}",
        eval_set_hash=None if eval_set is None else eval_set.content_hash,
        created_at=result.created_at,
    )
