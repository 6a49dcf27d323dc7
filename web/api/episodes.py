"""``POST /api/episodes``: production traffic for the execution loop."""

from __future__ import annotations

from fastapi import APIRouter

from web import actions
from web.actions import EpisodeRequest, EpisodesStarted
from web.api.documented_errors import WORKFLOW_ERRORS, errors
from web.deps import AuthorizeDep, ServicesDep, SessionDep

router = APIRouter(tags=["episodes"])


@router.post("/api/episodes", status_code=202, response_model=EpisodesStarted,
             responses={**WORKFLOW_ERRORS, **errors(429)})
async def start_episodes(
    body: EpisodeRequest, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> EpisodesStarted:
    """Start production episodes, served by the checkpoint governance's routing names.

    At most ``TRILOOP_MAX_PRODUCTION_BATCHES_IN_FLIGHT`` batches run at once: beyond it the
    answer is 429 with ``Retry-After``, so traffic cannot bury governance's eval batches."""
    return await actions.start_episodes(guard=guard, db=db, services=services, body=body)
