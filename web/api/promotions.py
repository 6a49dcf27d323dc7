"""``/api/promotions``: gates with evidence, and the human decisions sent to governance."""

from __future__ import annotations

from fastapi import APIRouter

from triloop.statuses import PromotionDecision, PromotionStatus
from web import actions
from web.actions import DecisionOutcome, DecisionRequest
from web.api.common import IdPrefix, Short
from web.api.documented_errors import WORKFLOW_ERRORS
from web.data import promotions
from web.data.promotions import PromotionDetail, PromotionSummary
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page
from web.problems import not_found

router = APIRouter(prefix="/api/promotions", tags=["promotions"])


@router.get("", response_model=Page[PromotionSummary])
async def list_promotions(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    status: PromotionStatus | None = None, checkpoint_id: Short | None = None,
    id_prefix: IdPrefix | None = None,
) -> Page[PromotionSummary]:
    """Promotions, newest first."""
    await guard("read", "promotion")
    return await db.read(promotions.list_promotions, limit=limit, cursor=cursor, status=status,
                         checkpoint_id=checkpoint_id, id_prefix=id_prefix)


@router.get("/{promotion_id}", response_model=PromotionDetail)
async def get_promotion(promotion_id: str, guard: AuthorizeDep, db: SessionDep) -> PromotionDetail:
    """A promotion's gate timeline with evidence and thresholds; approvals when allowed."""
    await guard("read", "promotion", id=promotion_id)
    await guard("read", "gate_result")
    with_approvals = await guard.allows("read", "approval", id=promotion_id)
    with_alarms = await guard.allows("read", "training_step")
    found = await db.read(promotions.promotion_detail, promotion_id=promotion_id,
                          with_approvals=with_approvals, with_alarms=with_alarms)
    if found is None:
        raise not_found("promotion", promotion_id)
    return found


async def _decide(
    decision: PromotionDecision, promotion_id: str, body: DecisionRequest, guard: AuthorizeDep,
    db: SessionDep, services: ServicesDep,
) -> DecisionOutcome:
    return await actions.decide_promotion(
        guard=guard, db=db, services=services, promotion_id=promotion_id, decision=decision,
        body=body,
    )


@router.post("/{promotion_id}/sign-audit", response_model=DecisionOutcome,
             responses=WORKFLOW_ERRORS)
async def sign_audit(
    promotion_id: str, body: DecisionRequest, guard: AuthorizeDep, db: SessionDep,
    services: ServicesDep,
) -> DecisionOutcome:
    """An auditor signs the audit (not the run's submitter)."""
    return await _decide(PromotionDecision.SIGN_AUDIT, promotion_id, body, guard, db, services)


@router.post("/{promotion_id}/reject-audit", response_model=DecisionOutcome,
             responses=WORKFLOW_ERRORS)
async def reject_audit(
    promotion_id: str, body: DecisionRequest, guard: AuthorizeDep, db: SessionDep,
    services: ServicesDep,
) -> DecisionOutcome:
    """An auditor refuses to sign, with the reason."""
    return await _decide(PromotionDecision.REJECT_AUDIT, promotion_id, body, guard, db, services)


@router.post("/{promotion_id}/approve", response_model=DecisionOutcome,
             responses=WORKFLOW_ERRORS)
async def approve_promotion(
    promotion_id: str, body: DecisionRequest, guard: AuthorizeDep, db: SessionDep,
    services: ServicesDep,
) -> DecisionOutcome:
    """An operator approves (not the submitter, not the auditor who signed)."""
    return await _decide(PromotionDecision.APPROVE, promotion_id, body, guard, db, services)


@router.post("/{promotion_id}/reject", response_model=DecisionOutcome,
             responses=WORKFLOW_ERRORS)
async def reject_promotion(
    promotion_id: str, body: DecisionRequest, guard: AuthorizeDep, db: SessionDep,
    services: ServicesDep,
) -> DecisionOutcome:
    """An operator rejects the candidate."""
    return await _decide(PromotionDecision.REJECT, promotion_id, body, guard, db, services)


@router.post("/{promotion_id}/override-alarms", response_model=DecisionOutcome,
             responses=WORKFLOW_ERRORS)
async def override_alarms(
    promotion_id: str, body: DecisionRequest, guard: AuthorizeDep, db: SessionDep,
    services: ServicesDep,
) -> DecisionOutcome:
    """An operator (not the run's submitter) lets a candidate past its run's stability alarms.

    The comment is the written reason, kept with the decision and the gate result.
    """
    return await _decide(PromotionDecision.OVERRIDE_ALARMS, promotion_id, body, guard, db, services)
