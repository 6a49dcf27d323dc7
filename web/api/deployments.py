"""``/api/deployments``, ``/api/routing``, and rollback as a deployment's sub-resource
(``POST /api/deployments/{alias}/rollback``, with its preview); ``POST /api/rollback`` is
kept as a deprecated alias."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Path, Query, Response

from web import actions
from web.actions import ALIAS_PATTERN, DeploymentRollback, RollbackOutcome, RollbackRequest
from web.api.documented_errors import WORKFLOW_ERRORS, errors
from web.data import deployments
from web.data.deployments import (
    DeploymentDetail,
    DeploymentPublic,
    RollbackPreview,
    RoutingPublic,
)
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page
from web.problems import conflict, invalid, not_found

router = APIRouter(tags=["deployments"])


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


@router.get("/api/deployments/{alias}/rollback-preview", response_model=RollbackPreview,
            responses=errors(409))
async def rollback_preview(
    alias: str, guard: AuthorizeDep, db: SessionDep,
    to_revision: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    to_checkpoint_id: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> RollbackPreview:
    """Dry run: the revision a rollback would return to, its checkpoint, who moved it there
    and why, with the alias's latest revisions. Changes nothing; 409 when it would be refused."""
    await guard("read", "deployment", id=alias)
    if to_revision is not None and to_checkpoint_id is not None:
        raise invalid("name to_revision or to_checkpoint_id, not both")
    preview = await actions.preview_rollback(db=db, alias=alias, to_revision=to_revision,
                                             to_checkpoint_id=to_checkpoint_id)
    if preview.refusal is not None:
        raise conflict(preview.refusal)
    return preview


@router.get("/api/routing", response_model=Page[RoutingPublic])
async def list_routing(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None
) -> Page[RoutingPublic]:
    """Which checkpoint serves production, canary and shadow traffic."""
    await guard("read", "routing")
    return await db.read(deployments.list_routing, limit=limit, cursor=cursor)


@router.post("/api/deployments/{alias}/rollback", response_model=RollbackOutcome,
             responses=WORKFLOW_ERRORS)
async def rollback_deployment(
    alias: Annotated[str, Path(pattern=ALIAS_PATTERN, max_length=200)],
    body: DeploymentRollback, guard: AuthorizeDep, db: SessionDep, services: ServicesDep,
) -> RollbackOutcome:
    """Roll this alias back through governance (see the rollback preview first); waits for
    the result."""
    request = RollbackRequest(alias=alias, **body.model_dump())
    return await actions.rollback(guard=guard, db=db, services=services, body=request)


@router.post("/api/rollback", response_model=RollbackOutcome, deprecated=True,
             responses={**WORKFLOW_ERRORS, **errors(404)})
async def rollback_legacy(
    body: RollbackRequest, guard: AuthorizeDep, db: SessionDep, services: ServicesDep,
    response: Response,
) -> RollbackOutcome:
    """Deprecated: use ``POST /api/deployments/{alias}/rollback``. Same effect, with the
    alias in the body; answers with a ``Deprecation`` header and a ``Link`` to the new path."""
    response.headers["Deprecation"] = "true"
    response.headers["Link"] = (f'</api/deployments/{quote(body.alias)}/rollback>; '
                                'rel="successor-version"')
    return await actions.rollback(guard=guard, db=db, services=services, body=body)
