"""``POST /api/episodes``: production traffic for the execution loop."""

from __future__ import annotations

from fastapi import APIRouter

from web import actions
from web.actions import EpisodeRequest, EpisodesStarted
from web.api.documented_errors import WORKFLOW_ERRORS
from web.deps import AuthorizeDep, ServicesDep, SessionDep

router = APIRouter(tags=["episodes"])


@router.post("/api/episodes", status_code=202, response_model=EpisodesStarted,
             responses=WORKFLOW_ERRORS)
async def start_episodes(
    body: EpisodeRequest, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> EpisodesStarted:
    """Start production episodes, served by the checkpoint governance's routing names."""
    return await actions.start_episodes(guard=guard, db=db, services=services, body=body)
