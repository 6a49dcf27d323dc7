"""``/api/eval-sets`` and ``/api/thresholds``: what judges a candidate (read-only)."""

from __future__ import annotations

from fastapi import APIRouter

from web.api.common import Short
from web.data import evaluation
from web.data.evaluation import EvalSetDetail, EvalSetPublic, ThresholdPublic
from web.deps import AuthorizeDep, SessionDep
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
