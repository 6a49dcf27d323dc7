"""The JSON API: one router per area, all under ``/api``, plus ``/healthz`` and ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from web.api import (
    audit,
    checkpoints,
    deployments,
    environments,
    episodes,
    evaluation,
    faults,
    metrics,
    model_imports,
    promotions,
    role_grants,
    runs,
    task_set_admission,
    task_sets,
    tokens,
    trajectories,
    users,
    webhooks,
)


class Health(BaseModel):
    """The process answers."""

    status: str


health_router = APIRouter(tags=["health"])


@health_router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Readiness for the dev stack (no authentication, touches nothing)."""
    return Health(status="ok")


ROUTERS: tuple[APIRouter, ...] = (
    health_router, users.router, role_grants.router, tokens.router, runs.router, checkpoints.router,
    environments.router, evaluation.router, promotions.router, deployments.router,
    episodes.router, audit.router, faults.router, model_imports.router, task_sets.router,
    task_set_admission.router, trajectories.router, webhooks.router, metrics.router,
)
