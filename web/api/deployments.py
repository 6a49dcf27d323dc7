"""``/api/deployments``, ``/api/routing`` and ``POST /api/rollback``."""

from __future__ import annotations

from fastapi import APIRouter

from web import actions
from web.actions import RollbackOutcome, RollbackRequest
from web.api.common import ERRORS
from web.data import deployments
from web.data.deployments import DeploymentDetail, DeploymentPublic, RoutingPublic
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page
from web.problems import not_found

router = APIRouter(tags=["deployments"], responses=ERRORS)


@router.get("/api/deployments", response_model=Page[DeploymentPublic])
async def list_deployments(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None
) -> Page[DeploymentPublic]:
    """Aliases and the checkpoints they name."""
    await guard("read", "deployment")
    return await db.read(deployments.list_deployments, limit=limit, cursor=cursor)


@router.get("/api/deployments/{alias}", response_model=DeploymentDetail)
async def get_deployment(alias: str, guard: AuthorizeDep, db: SessionDep) -> DeploymentDetail:
    """An alias with its rollback target and history."""
    await guard("read", "deployment", id=alias)
    found = await db.read(deployments.deployment_detail, alias=alias)
    if found is None:
        raise not_found("deployment alias", alias)
    return found


@router.get("/api/routing", response_model=Page[RoutingPublic])
async def list_routing(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None
) -> Page[RoutingPublic]:
    """Which checkpoint serves production, canary and shadow traffic."""
    await guard("read", "routing")
    return await db.read(deployments.list_routing, limit=limit, cursor=cursor)


@router.post("/api/rollback", response_model=RollbackOutcome)
async def rollback(
    body: RollbackRequest, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> RollbackOutcome:
    """Roll an alias back to its target through governance; waits for the result."""
    return await actions.rollback(guard=guard, db=db, services=services, body=body)
