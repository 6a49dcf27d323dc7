"""``/api/checkpoints``: checkpoints and their lineage (parent chain, environments, eval sets)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from triloop.models import Checkpoint
from web.api.common import ERRORS, IdPrefix, Short
from web.data import lineage
from web.data.lineage import CheckpointPublic, Lineage
from web.deps import AuthorizeDep, SessionDep
from web.id_refs import one_id, resolve_ref
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


CheckpointRef = Annotated[str, Path(min_length=1, max_length=200, description=(
    "the checkpoint's id (sha256 of its weights) or a unique prefix of it"))]
AMBIGUOUS: dict[int | str, dict[str, Any]] = {422: {
    **ERRORS[422], "description": "The input does not match the schema, or the prefix starts"
    " more than one checkpoint id (the candidates listed)"}}


async def resolve_checkpoint(db: SessionDep, ref: str) -> str:
    """The checkpoint id ``ref`` is or uniquely starts: 404 for none, 422 for several."""
    return one_id(await db.read(resolve_ref, id_column=Checkpoint.id, ref=ref), "checkpoint")


@router.get("/{checkpoint_id}", response_model=CheckpointPublic, responses=AMBIGUOUS)
async def get_checkpoint(
    checkpoint_id: CheckpointRef, guard: AuthorizeDep, db: SessionDep
) -> CheckpointPublic:
    """One checkpoint (id = sha256 of its weights), by id or unique id prefix."""
    await guard("read", "checkpoint")
    checkpoint_id = await resolve_checkpoint(db, checkpoint_id)
    await guard("read", "checkpoint", id=checkpoint_id)
    found = await db.read(lineage.get_checkpoint, checkpoint_id=checkpoint_id)
    if found is None:
        raise not_found("checkpoint", checkpoint_id)
    return found


@router.get("/{checkpoint_id}/lineage", response_model=Lineage, responses=AMBIGUOUS)
async def get_lineage(checkpoint_id: CheckpointRef, guard: AuthorizeDep,
                      db: SessionDep) -> Lineage:
    """The chain from the base model to this checkpoint (by id or unique id prefix), with
    runs, environments, eval sets."""
    await guard("read", "checkpoint")
    checkpoint_id = await resolve_checkpoint(db, checkpoint_id)
    await guard("read", "checkpoint", id=checkpoint_id)
    found = await db.read(lineage.lineage, checkpoint_id=checkpoint_id)
    if found is None:
        raise not_found("checkpoint", checkpoint_id)
    return found
