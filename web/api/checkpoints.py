"""``/api/checkpoints``: checkpoints and their lineage (parent chain, environments, eval sets)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from web.api.common import IdPrefix, Short
from web.data import lineage
from web.data.lineage import CheckpointPublic, Lineage
from web.deps import AuthorizeDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page
from web.problems import not_found

router = APIRouter(prefix="/api/checkpoints", tags=["checkpoints"])


@router.get("", response_model=Page[CheckpointPublic])
async def list_checkpoints(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    run_id: Short | None = None, id_prefix: IdPrefix | None = None, name: Short | None = None,
    bases: Annotated[bool, Query(description="only bases: imported models and the model "
                                 "directories runs started from")] = False,
) -> Page[CheckpointPublic]:
    """Checkpoints, newest first: of one run, by id prefix or name, or only bases."""
    await guard("read", "checkpoint")
    return await db.read(lineage.list_checkpoints, limit=limit, cursor=cursor, run_id=run_id,
                         id_prefix=id_prefix, name=name, bases=bases)


@router.get("/{checkpoint_id}", response_model=CheckpointPublic)
async def get_checkpoint(
    checkpoint_id: str, guard: AuthorizeDep, db: SessionDep
) -> CheckpointPublic:
    """One checkpoint (id = sha256 of its weights)."""
    await guard("read", "checkpoint", id=checkpoint_id)
    found = await db.read(lineage.get_checkpoint, checkpoint_id=checkpoint_id)
    if found is None:
        raise not_found("checkpoint", checkpoint_id)
    return found


@router.get("/{checkpoint_id}/lineage", response_model=Lineage)
async def get_lineage(checkpoint_id: str, guard: AuthorizeDep, db: SessionDep) -> Lineage:
    """The chain from the base model to this checkpoint, with runs, environments, eval sets."""
    await guard("read", "checkpoint", id=checkpoint_id)
    found = await db.read(lineage.lineage, checkpoint_id=checkpoint_id)
    if found is None:
        raise not_found("checkpoint", checkpoint_id)
    return found
