"""``/api/faults``: game-day serving faults (operators only, audited)."""

from __future__ import annotations

from fastapi import APIRouter

from web import faults
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.faults import FaultPublic, FaultRequest, FaultsCleared

router = APIRouter(tags=["faults"])


@router.get("/api/faults", response_model=list[FaultPublic])
async def list_faults(
    guard: AuthorizeDep, services: ServicesDep, db: SessionDep
) -> list[FaultPublic]:
    """Serving faults the execution workers apply now, with who injected each since when."""
    return await faults.list_faults(guard=guard, services=services, db=db)


@router.post("/api/faults", status_code=201, response_model=FaultPublic)
async def inject_fault(
    body: FaultRequest, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> FaultPublic:
    """Serve one checkpoint's production and canary episodes degraded, on record."""
    return await faults.inject_fault(guard=guard, db=db, services=services, body=body)


@router.delete("/api/faults", response_model=FaultsCleared)
async def clear_faults(guard: AuthorizeDep, services: ServicesDep) -> FaultsCleared:
    """Remove every serving fault."""
    return await faults.clear_faults(guard=guard, services=services)
