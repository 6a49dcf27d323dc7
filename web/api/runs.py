"""``/api/runs``: submit (and a run's placebo), list, compare, detail with metrics, alarms,
progress and proposals, pause/resume/cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from triloop.statuses import RunStatus
from web import actions
from web.actions import RunControlRequest, RunSubmit
from web.api.common import IdPrefix, Short
from web.api.documented_errors import WORKFLOW_ERRORS
from web.data import run_compare, runs
from web.data.run_compare import RunComparison
from web.data.runs import RunDetail, RunListed, RunMetrics, RunSummary
from web.deps import AuthorizeDep, Guard, ServicesDep, SessionDep, Sessions
from web.pagination import CursorParam, LimitParam, Page
from web.problems import invalid, not_found
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


@router.get("", response_model=Page[RunListed])
async def list_runs(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    submitted_by: Short | None = None, status: RunStatus | None = None,
    id_prefix: IdPrefix | None = None,
) -> Page[RunListed]:
    """Training runs, newest first, each with its last iteration's reward and success."""
    await guard("read", "training_run")
    return await db.read(runs.list_runs, limit=limit, cursor=cursor,
                         submitted_by=submitted_by, status=status, id_prefix=id_prefix)


CompareIds = Annotated[str, Query(
    min_length=1, max_length=run_compare.MAX_COMPARED * 65,
    description=f"{run_compare.MIN_COMPARED} to {run_compare.MAX_COMPARED} run ids, comma "
                "separated, in the order to show them")]


async def compared(guard: Guard, db: Sessions, ids: list[str]) -> RunComparison:
    """The comparison of these runs (each read is authorized); 422/404 naming the ids."""
    try:
        run_ids = run_compare.parse_run_ids(ids)
    except run_compare.ComparisonRefused as refused:
        raise invalid(str(refused), reasons=[f"ids: {refused}"]) from None
    for run_id in run_ids:
        await guard("read", "training_run", id=run_id)
    await guard("read", "training_step")
    try:
        return await db.read(run_compare.compare_runs, run_ids=run_ids)
    except run_compare.RunsNotFound as missing:
        raise not_found("training run", ", ".join(missing.run_ids)) from None


@router.get("/compare", response_model=RunComparison)
async def compare_runs(guard: AuthorizeDep, db: SessionDep, ids: CompareIds) -> RunComparison:
    """Several runs side by side: a label per run (name or short id, and submitter), the
    RUN.yaml settings whose values differ, and each run's series."""
    return await compared(guard, db, [ids])


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
