"""``/api/eval-sets`` and ``/api/thresholds``: what judges a candidate.

Operators create (and freeze) eval set versions and set threshold versions here; governance
writes them on the operator's recorded decision (``web.governance_writes``).
"""

from __future__ import annotations

from fastapi import APIRouter

from web import governance_writes
from web.api.common import Short
from web.api.documented_errors import WORKFLOW_ERRORS
from web.data import evaluation
from web.data.evaluation import EvalSetDetail, EvalSetPublic, ThresholdPublic
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.governance_writes import EvalSetFreeze, EvalSetFrozen, ThresholdSet, ThresholdStored
from web.pagination import CursorParam, LimitParam, Page
from web.problems import not_found

router = APIRouter(tags=["evaluation"])


@router.get("/api/eval-sets", response_model=Page[EvalSetPublic])
async def list_eval_sets(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None
) -> Page[EvalSetPublic]:
    """Eval sets, newest first."""
    await guard("read", "eval_set")
    return await db.read(evaluation.list_eval_sets, limit=limit, cursor=cursor)


@router.post("/api/eval-sets", status_code=201, response_model=EvalSetFrozen,
             responses=WORKFLOW_ERRORS)
async def freeze_eval_set(
    body: EvalSetFreeze, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> EvalSetFrozen:
    """An operator creates the next version of an eval set from admitted tasks, frozen."""
    return await governance_writes.freeze_eval_set(guard=guard, db=db, services=services,
                                                   body=body)


@router.post("/api/thresholds", status_code=201, response_model=ThresholdStored,
             responses=WORKFLOW_ERRORS)
async def set_threshold(
    body: ThresholdSet, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> ThresholdStored:
    """An operator sets the next version of a threshold for a frozen eval set."""
    return await governance_writes.set_threshold(guard=guard, db=db, services=services,
                                                 body=body)


@router.get("/api/eval-sets/{eval_set_id}", response_model=EvalSetDetail)
async def get_eval_set(eval_set_id: str, guard: AuthorizeDep, db: SessionDep) -> EvalSetDetail:
    """An eval set with its thresholds; its items only for roles that may read them."""
    await guard("read", "eval_set", id=eval_set_id)
    with_items = await guard.allows("read", "eval_item", id=eval_set_id)
    found = await db.read(evaluation.eval_set_detail, eval_set_id=eval_set_id,
                          with_items=with_items)
    if found is None:
        raise not_found("eval set", eval_set_id)
    return found


@router.get("/api/thresholds", response_model=Page[ThresholdPublic])
async def list_thresholds(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    eval_set_id: Short | None = None,
) -> Page[ThresholdPublic]:
    """Thresholds, newest first."""
    await guard("read", "threshold")
    return await db.read(evaluation.list_thresholds, limit=limit, cursor=cursor,
                         eval_set_id=eval_set_id)


@router.get("/api/thresholds/{threshold_id}", response_model=ThresholdPublic)
async def get_threshold(threshold_id: str, guard: AuthorizeDep, db: SessionDep) -> ThresholdPublic:
    """One threshold spec."""
    await guard("read", "threshold", id=threshold_id)
    found = await db.read(evaluation.get_threshold, threshold_id=threshold_id)
    if found is None:
        raise not_found("threshold", threshold_id)
    return found
