"""``/api/runs``: submit (and a run's placebo), list, detail with metrics and alarms,
pause/resume/cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from triloop.statuses import RunStatus
from web import actions
from web.actions import RunControlRequest, RunSubmit
from web.api.common import IdPrefix, Short
from web.api.documented_errors import WORKFLOW_ERRORS
from web.data import runs
from web.data.runs import RunDetail, RunMetrics, RunSummary
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page
from web.problems import not_found
from web.query import DIGITS_ONLY

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.post("", status_code=201, response_model=RunSummary,
             responses=WORKFLOW_ERRORS)
async def submit_run(
    body: RunSubmit, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> RunSummary:
    """Submit a training run (RUN.yaml as JSON or YAML text); starts it on the learning loop."""
    return await actions.submit_run(guard=guard, db=db, services=services, body=body)


@router.post("/{run_id}/placebo", status_code=201, response_model=RunSummary,
             responses=WORKFLOW_ERRORS)
async def submit_placebo(
    run_id: str, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> RunSummary:
    """Submit the placebo of one's own run: its config with the task reward zeroed
    (advantage.zero_task_reward), the same seed, named "<name> (placebo)"."""
    return await actions.submit_placebo(guard=guard, db=db, services=services, run_id=run_id)


@router.get("", response_model=Page[RunSummary])
async def list_runs(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    submitted_by: Short | None = None, status: RunStatus | None = None,
    id_prefix: IdPrefix | None = None,
) -> Page[RunSummary]:
    """Training runs, newest first."""
    await guard("read", "training_run")
    return await db.read(runs.list_runs, limit=limit, cursor=cursor,
                         submitted_by=submitted_by, status=status, id_prefix=id_prefix)


@router.get("/{run_id}", response_model=RunDetail)
async def get_run(run_id: str, guard: AuthorizeDep, db: SessionDep) -> RunDetail:
    """A run with its config, per-iteration metrics, alarms and checkpoints."""
    await guard("read", "training_run", id=run_id)
    await guard("read", "training_step")
    detail = await db.read(runs.run_detail, run_id=run_id)
    if detail is None:
        raise not_found("training run", run_id)
    return detail


@router.get("/{run_id}/metrics", response_model=RunMetrics)
async def get_run_metrics(
    run_id: str, guard: AuthorizeDep, db: SessionDep,
    after: Annotated[int | None, Query(ge=-1, le=2**31 - 1,
                                       description="only iterations after this"),
                     DIGITS_ONLY] = None,
) -> RunMetrics:
    """Metrics after an iteration: what live charts poll."""
    await guard("read", "training_step", id=run_id)
    metrics = await db.read(runs.run_metrics, run_id=run_id, after=after)
    if metrics is None:
        raise not_found("training run", run_id)
    return metrics


async def _control(
    action: actions.RunAction, run_id: str, body: RunControlRequest | None, guard: AuthorizeDep,
    db: SessionDep, services: ServicesDep,
) -> RunSummary:
    reason = body.reason if body is not None else ""
    return await actions.control_run(guard=guard, db=db, services=services, run_id=run_id,
                                     action=action, reason=reason)


@router.post("/{run_id}/pause", status_code=202, response_model=RunSummary,
             responses=WORKFLOW_ERRORS)
async def pause_run(
    run_id: str, guard: AuthorizeDep, db: SessionDep, services: ServicesDep,
    body: RunControlRequest | None = None,
) -> RunSummary:
    """Ask one's own run to pause after its current iteration."""
    return await _control("pause", run_id, body, guard, db, services)


@router.post("/{run_id}/resume", status_code=202, response_model=RunSummary,
             responses=WORKFLOW_ERRORS)
async def resume_run(
    run_id: str, guard: AuthorizeDep, db: SessionDep, services: ServicesDep,
    body: RunControlRequest | None = None,
) -> RunSummary:
    """Resume one's own paused run."""
    return await _control("resume", run_id, body, guard, db, services)


@router.post("/{run_id}/cancel", status_code=202, response_model=RunSummary,
             responses=WORKFLOW_ERRORS)
async def cancel_run(
    run_id: str, guard: AuthorizeDep, db: SessionDep, services: ServicesDep,
    body: RunControlRequest | None = None,
) -> RunSummary:
    """Cancel one's own run."""
    return await _control("cancel", run_id, body, guard, db, services)
