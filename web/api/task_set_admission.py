"""``POST /api/task-sets/{task_set_id}/admission``: one decision admits or rejects a task set."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from web import actions
from web.actions import AdmissionRequest, TaskSetAdmissionOutcome
from web.api.documented_errors import WORKFLOW_ERRORS
from web.deps import AuthorizeDep, ServicesDep, SessionDep

router = APIRouter(tags=["environments"])


TaskSetRef = Annotated[str, Path(min_length=1, max_length=200,
                                 description="the task set's id, a unique id prefix, or NAME@V")]


@router.post("/api/task-sets/{task_set_id}/admission", response_model=TaskSetAdmissionOutcome,
             responses=WORKFLOW_ERRORS)
async def decide_task_set_admission(
    task_set_id: TaskSetRef, body: AdmissionRequest, guard: AuthorizeDep, db: SessionDep,
    services: ServicesDep,
) -> TaskSetAdmissionOutcome:
    """An operator admits an assessed, admissible task set, or rejects it, saying why; every
    pending member task is admitted or rejected with it."""
    return await actions.decide_task_set_admission(guard=guard, db=db, services=services,
                                                   ref=task_set_id, body=body)
