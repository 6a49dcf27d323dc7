"""``/api/environments``, ``/api/environment-versions`` and ``/api/tasks``: contracts and tasks."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from triloop.statuses import TaskSplit, TaskStatus
from web import actions, governance_writes
from web.actions import AdmissionOutcome, AdmissionRequest
from web.api.common import IdPrefix, Short
from web.api.documented_errors import WORKFLOW_ERRORS
from web.data import environments as envs
from web.data.environments import (
    ContractDiff,
    EnvironmentDetail,
    EnvironmentPublic,
    TaskPublic,
    VersionDetail,
)
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.governance_writes import EnvironmentRegistered, EnvironmentRegistration
from web.id_refs import one_id
from web.pagination import CursorParam, LimitParam, Page
from web.problems import invalid, not_found
from web.query import DIGITS_ONLY

router = APIRouter(tags=["environments"])
VersionNumber = Annotated[
    int, Query(ge=1, le=2**31 - 1, description="a version number"), DIGITS_ONLY
]


@router.get("/api/environments", response_model=Page[EnvironmentPublic])
async def list_environments(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None
) -> Page[EnvironmentPublic]:
    """Environments, newest first."""
    await guard("read", "environment")
    return await db.read(envs.list_environments, limit=limit, cursor=cursor)


@router.post("/api/environments", status_code=201, response_model=EnvironmentRegistered,
             responses={200: {"model": EnvironmentRegistered,
                              "description": "identical content was already registered"},
                        **WORKFLOW_ERRORS})
async def register_environment(
    body: EnvironmentRegistration, response: Response, guard: AuthorizeDep, db: SessionDep,
    services: ServicesDep,
) -> EnvironmentRegistered:
    """An operator registers a contract as its environment's next immutable version.

    Every problem in the contract is named (422) and nothing is recorded; otherwise the
    decision is recorded and governance registers the version for the operator.
    """
    registered = await governance_writes.register_environment(
        guard=guard, db=db, services=services, body=body)
    if not registered.created:
        response.status_code = 200
    return registered


@router.get("/api/environments/{name}", response_model=EnvironmentDetail)
async def get_environment(name: str, guard: AuthorizeDep, db: SessionDep) -> EnvironmentDetail:
    """An environment with its versions."""
    await guard("read", "environment", id=name)
    await guard("read", "environment_version")
    found = await db.read(envs.environment_detail, name=name)
    if found is None:
        raise not_found("environment", name)
    return found


@router.get("/api/environments/{name}/diff", response_model=ContractDiff)
async def diff_versions(
    name: str, guard: AuthorizeDep, db: SessionDep,
    a: VersionNumber,
    b: VersionNumber,
) -> ContractDiff:
    """What changed in the contract from version A to version B."""
    await guard("read", "environment_version")
    found = await db.read(envs.contract_diff, name=name, a=a, b=b)
    if found is None:
        raise not_found("environment version", f"{name} v{a} or v{b}")
    return found


@router.get("/api/environment-versions/{version_id}", response_model=VersionDetail)
async def get_version(version_id: str, guard: AuthorizeDep, db: SessionDep) -> VersionDetail:
    """A version's contract, fixture hashes and task counts."""
    await guard("read", "environment_version", id=version_id)
    found = await db.read(envs.version_detail, version_id=version_id)
    if found is None:
        raise not_found("environment version", version_id)
    return found


TagFilter = Annotated[list[str] | None, Query(
    max_length=16, description="key=value: only tasks carrying this tag (repeat: all of them)")]


@router.get("/api/tasks", response_model=Page[TaskPublic])
async def list_tasks(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    environment_version_id: Short | None = None, status: TaskStatus | None = None,
    environment: Short | None = None, split: TaskSplit | None = None,
    tag: TagFilter = None, id_prefix: IdPrefix | None = None,
) -> Page[TaskPublic]:
    """Tasks, newest first, with their admission status, environment, the splits of the
    task sets they are in, and their tags; filtered by environment (name), status, split
    (in any task set), tags (``key=value``, all of them) or id prefix."""
    await guard("read", "task")
    tags, bad = envs.parse_tag_filters(tag or [])
    if bad:
        raise invalid("a tag filter is not key=value", bad)
    return await db.read(envs.list_tasks, limit=limit, cursor=cursor,
                         environment_version_id=environment_version_id, status=status,
                         environment=environment, split=split, tags=tags, id_prefix=id_prefix)


async def resolve_task(db: SessionDep, ref: str) -> str:
    """The task id ``ref`` is or uniquely starts; 404 when none, 422 naming the candidates
    when several."""
    return one_id(await db.read(envs.resolve_task_ref, ref=ref), "task")


@router.get("/api/tasks/{task_id}", response_model=TaskPublic)
async def get_task(task_id: str, guard: AuthorizeDep, db: SessionDep) -> TaskPublic:
    """A task (by id or unique id prefix) and the evidence for its admission decision."""
    await guard("read", "task")
    task_id = await resolve_task(db, task_id)
    await guard("read", "task", id=task_id)
    found = await db.read(envs.get_task, task_id=task_id)
    if found is None:
        raise not_found("task", task_id)
    return found


@router.post("/api/tasks/{task_id}/admission", response_model=AdmissionOutcome,
             responses=WORKFLOW_ERRORS)
async def decide_admission(
    task_id: str, body: AdmissionRequest, guard: AuthorizeDep, db: SessionDep,
    services: ServicesDep,
) -> AdmissionOutcome:
    """An operator admits an assessed, admissible task (by id or unique id prefix), or
    rejects it, saying why."""
    return await actions.decide_admission(guard=guard, db=db, services=services,
                                          task_id=await resolve_task(db, task_id), body=body)
