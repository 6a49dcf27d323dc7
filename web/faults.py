"""Game-day serving faults, injected and cleared by an operator through the web service.

A fault changes how production and canary episodes of one checkpoint are served
(``triloop.faults``), so it is a person's act: the web service proves who asks,
``authorize()`` decides (only operators; no loop, see ``policies/.../faults.rego``)
and both the decision and the change are audited. The execution workers read the
faults file under the stack's home at each episode and mark every episode a fault
touched; governance never counts such episodes toward passing a candidate.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, Field, field_validator
from sqlalchemy import text
from sqlmodel import Session

from triloop.audit import record_event
from triloop.faults import (
    ServingFault,
    clear_serving_faults,
    inject_serving_fault,
    read_serving_faults,
)
from web.data import runs
from web.deps import Guard, Sessions, WebServices
from web.problems import not_found

KIND = "serving_fault"


class FaultRequest(BaseModel):
    """Serve one checkpoint's production and canary episodes at another temperature."""

    checkpoint_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")
    temperature: float = Field(
        default=4.0, gt=0, le=1000, description="sampling temperature its episodes get")
    note: str = Field(default="game day", min_length=1, max_length=500, pattern=r"\S",
                      description="why: recorded on every episode it touches")

    @field_validator("temperature")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("temperature must be a finite number")
        return value


class FaultPublic(BaseModel):
    """An active serving fault: what it does, why, and who injected it since when."""

    checkpoint_id: str
    temperature: float
    note: str
    injected_by: str | None = Field(
        default=None, description="the operator who injected it, from the audit log (null"
        " when the log holds no injection of it)")
    injected_at: datetime | None = Field(
        default=None, description="when it was injected, from the audit log: the fault is in"
        " force since then")


class FaultsCleared(BaseModel):
    """How many faults an operator cleared."""

    cleared: int


def _public(fault: ServingFault, injected: Injection | None = None) -> FaultPublic:
    return FaultPublic(checkpoint_id=fault.checkpoint_id, temperature=fault.temperature,
                       note=fault.note, injected_by=injected.by if injected else None,
                       injected_at=injected.at if injected else None)


@dataclass(frozen=True)
class Injection:
    """Who injected a checkpoint's fault and when: the audit log's record of it."""

    by: str
    at: datetime


# The fault's own record (``inject_fault`` below writes it, with the note); the newest per
# checkpoint is the injection in force, since a second injection replaces the first.
_INJECTIONS = text(
    "SELECT DISTINCT ON (resource->>'id') resource->>'id', actor->>'user', at"
    " FROM audit_event WHERE action = 'inject_fault' AND decision = 'record'"
    " AND resource->>'kind' = :kind AND resource->>'id' = ANY(:ids)"
    " AND payload->>'note' IS NOT NULL"
    " ORDER BY resource->>'id', seq DESC")


def injections(*, session: Session, checkpoint_ids: list[str]) -> dict[str, Injection]:
    """The latest recorded injection of each checkpoint's fault."""
    if not checkpoint_ids:
        return {}
    rows = session.execute(_INJECTIONS, {"kind": KIND, "ids": checkpoint_ids}).all()
    return {str(r[0]): Injection(by=str(r[1] or "?"), at=r[2]) for r in rows}


async def faults_in_force(*, services: WebServices, db: Sessions) -> list[FaultPublic]:
    """The faults the execution workers apply now, with who injected each since when.

    Unaudited: the console's banner asks this on every page, for whoever the policy lets
    read serving faults (``list_faults`` is the audited read).
    """
    faults = await asyncio.to_thread(read_serving_faults, _home(services))
    if not faults:
        return []
    found = await db.read(injections, checkpoint_ids=sorted(faults))
    return [_public(f, found.get(f.checkpoint_id))
            for f in sorted(faults.values(), key=lambda f: f.checkpoint_id)]


def _home(services: WebServices) -> Path:
    return services.settings.home


async def list_faults(
    *, guard: Guard, services: WebServices, db: Sessions
) -> list[FaultPublic]:
    """The faults the execution workers apply now (an audited read)."""
    await guard("read", KIND)
    return await faults_in_force(services=services, db=db)


async def inject_fault(
    *, guard: Guard, db: Sessions, services: WebServices, body: FaultRequest
) -> FaultPublic:
    """Authorize the operator, then degrade the checkpoint's serving (audited)."""
    await guard("inject_fault", KIND, id=body.checkpoint_id,
                attrs={"temperature": body.temperature, "note": body.note})
    if not await db.read(runs.checkpoint_exists, checkpoint_id=body.checkpoint_id):
        raise not_found("checkpoint", body.checkpoint_id)
    fault = ServingFault(body.checkpoint_id, body.temperature, body.note.strip())
    await asyncio.to_thread(inject_serving_fault, _home(services), fault)
    await asyncio.to_thread(
        record_event, services.engine, actor=guard.principal.actor.to_input(),
        credential=guard.principal.credential,
        action="inject_fault", resource={"kind": KIND, "id": body.checkpoint_id},
        payload={"temperature": fault.temperature, "note": fault.note})
    return _public(fault)


async def clear_faults(*, guard: Guard, services: WebServices) -> FaultsCleared:
    """Authorize the operator, then remove every fault (audited)."""
    await guard("clear_fault", KIND)
    cleared = await asyncio.to_thread(clear_serving_faults, _home(services))
    await asyncio.to_thread(
        record_event, services.engine, actor=guard.principal.actor.to_input(),
        credential=guard.principal.credential,
        action="clear_fault", resource={"kind": KIND}, payload={"cleared": cleared})
    return FaultsCleared(cleared=cleared)
