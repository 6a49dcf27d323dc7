"""``/api/model-imports``: import a pretrained model as a named base, and follow the import."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from web import model_imports
from web.api.documented_errors import WORKFLOW_ERRORS
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.model_imports import NAME_PATTERN, ModelImportRequest, ModelImportStatus

router = APIRouter(prefix="/api/model-imports", tags=["checkpoints"])


@router.post("", status_code=202, response_model=ModelImportStatus, responses=WORKFLOW_ERRORS)
async def import_model(
    body: ModelImportRequest, guard: AuthorizeDep, db: SessionDep, services: ServicesDep
) -> ModelImportStatus:
    """Start importing a model (ML engineers, operators); follow it at its name's URL."""
    return await model_imports.start_import(guard=guard, db=db, services=services, body=body)


@router.get("/{name}", response_model=ModelImportStatus, responses=WORKFLOW_ERRORS)
async def get_model_import(
    name: Annotated[str, Path(pattern=NAME_PATTERN)], guard: AuthorizeDep, db: SessionDep,
    services: ServicesDep,
) -> ModelImportStatus:
    """The latest import of this name: running (its stage), completed, or failed (why)."""
    return await model_imports.import_progress(guard=guard, db=db, services=services, name=name)
