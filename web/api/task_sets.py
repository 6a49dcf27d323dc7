"""``/api/task-sets``: task sets registered from datasets, generators and seed lists."""

from __future__ import annotations

from fastapi import APIRouter, Response

from web import task_sets
from web.api.common import Short
from web.api.documented_errors import WORKFLOW_ERRORS
from web.data import task_sets as data
from web.data.task_sets import AmbiguousTaskSet, TaskSetDetail, TaskSetPublic
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page
from web.problems import invalid, not_found
from web.task_sets import TaskSetRegistered, TaskSetRegistrationBody

router = APIRouter(tags=["task sets"])


@router.get("/api/task-sets", response_model=Page[TaskSetPublic])
async def list_task_sets(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    name: Short | None = None,
) -> Page[TaskSetPublic]:
    """Task sets, newest first, with their members per split."""
    await guard("read", "task_set")
    return await db.read(data.list_task_sets, limit=limit, cursor=cursor, name=name)


@router.post("/api/task-sets", status_code=201, response_model=TaskSetRegistered,
             responses={200: {"model": TaskSetRegistered,
                              "description": "identical content was already registered"},
                        **WORKFLOW_ERRORS})
async def register_task_set(
    body: TaskSetRegistrationBody, response: Response, guard: AuthorizeDep, db: SessionDep,
    services: ServicesDep,
) -> TaskSetRegistered:
    """An operator registers a task set: every task described by the execution loop, split,
    and written by governance in one transaction; its admission starts at once.

    A malformed dataset row, a bad split rule, an unknown environment version, a generator
    for an environment without one, or one item twice in the set is a 422 naming each
    problem, and no task, set or member is written.
    """
    registered = await task_sets.register_task_set(guard=guard, db=db, services=services,
                                                   body=body)
    if not registered.created:
        response.status_code = 200
    return registered


@router.get("/api/task-sets/{ref}", response_model=TaskSetDetail)
async def get_task_set(ref: str, guard: AuthorizeDep, db: SessionDep) -> TaskSetDetail:
    """A task set by id, unique id prefix, NAME@V or NAME (newest), with its members per
    split and its first 100 members."""
    await guard("read", "task_set", id=ref)
    try:
        found = await db.read(data.task_set_detail, ref=ref)
    except AmbiguousTaskSet as error:
        raise invalid("the task set is ambiguous", [str(error)]) from error
    if found is None:
        raise not_found("task set", ref)
    return found
