"""A person's import of a pretrained model: authorize, check the name, start the learning loop.

The web service holds no artifact store and inserts no checkpoint: the import runs where
checkpoints are written, as the learning loop's ``ModelImportWorkflow`` (the web token
may start workflows in learning's namespace). Here the person is authorized (``import``
``checkpoint``, audited with the source and name), the name is checked free (409 before
any work), and the workflow is started under an id made of the name, so a second import
of the same name while one runs is refused too. ``import_progress`` reads back where the
workflow is: running (with the stage its activity last heartbeat), completed (the
checkpoint), or failed (the learning loop's sentence naming the problem).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from triloop.workflow_api import EXAMPLE_MODELS, ModelImportInput, model_import_workflow_id
from web.data import lineage
from web.data.lineage import CheckpointPublic
from web.deps import Guard, Sessions, WebServices
from web.problems import conflict, not_found

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
# A name RUN.yaml could mistake for a checkpoint id (prefix) is refused.
_ID_LIKE = re.compile(r"^[0-9a-f]{6,64}$")


class ModelImportRequest(BaseModel):
    """Import a model: ``source`` (an absolute path on the learning worker: a Hugging Face
    directory or a ``.gguf`` file) or ``example`` (a model shipped as a package)."""

    source: str | None = Field(default=None, min_length=2, max_length=4096,
                               description="absolute path on the learning worker")
    example: str | None = Field(default=None, max_length=100, description="an example model's"
                                f" name: one of {sorted(EXAMPLE_MODELS)}")
    name: str | None = Field(default=None, pattern=NAME_PATTERN, description=(
        "unique name for RUN.yaml's model.base; default: the example's, or the source's"
        " folder or file name"))

    @field_validator("source")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("give the source as an absolute path on the learning worker")
        return value

    @field_validator("example")
    @classmethod
    def _known_example(cls, value: str | None) -> str | None:
        if value is not None and value not in EXAMPLE_MODELS:
            raise ValueError(f"no example model {value!r}; choose from {sorted(EXAMPLE_MODELS)}")
        return value

    @field_validator("name")
    @classmethod
    def _not_id_like(cls, value: str | None) -> str | None:
        if value is not None and _ID_LIKE.match(value):
            raise ValueError(f"{value!r} looks like a checkpoint id; choose a name with a"
                             " letter beyond a-f")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelImportRequest:
        if (self.source is None) == (self.example is None):
            raise ValueError("give exactly one of 'source' or 'example'")
        return self

    def import_name(self) -> str:
        """The name asked for, or the default one."""
        if self.name is not None:
            return self.name
        if self.example is not None:
            return str(self.example)
        return default_import_name(self.source or "")


def default_import_name(source: str) -> str:
    """A source's folder or file name (``.gguf`` dropped), made a valid name."""
    stem = source.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:100]
    return cleaned if cleaned and not _ID_LIKE.match(cleaned) else f"model-{cleaned}"[:100]


ImportState = Literal["running", "completed", "failed"]


class ModelImportStatus(BaseModel):
    """Where an import is: its stage while it runs, its checkpoint, or why it failed."""

    name: str
    workflow_id: str
    status: ImportState
    stage: str | None = Field(default=None, description="checking | loading | saving")
    checkpoint: CheckpointPublic | None = None
    problem: str | None = Field(default=None, description="why it failed, as the loop said")
    reasons: list[str] = Field(default_factory=list)


async def start_import(
    *, guard: Guard, db: Sessions, services: WebServices, body: ModelImportRequest
) -> ModelImportStatus:
    """Authorize the person, refuse a taken name, and start the learning loop's import."""
    name = body.import_name()
    await guard("import", "checkpoint", attrs={
        "name": name, "source": body.source, "example": body.example})
    taken = await db.read(lineage.checkpoint_by_name, name=name)
    if taken is not None:
        raise conflict(f"the name {name!r} is taken by checkpoint {taken.id}; choose another")
    workflow_id = model_import_workflow_id(name)
    await services.orchestrator.start_model_import(
        ModelImportInput(name=name, source=body.source or "", example=body.example or "",
                         requested_by=guard.principal.name), workflow_id)
    return ModelImportStatus(name=name, workflow_id=workflow_id, status="running",
                             stage="submitted")


async def import_progress(
    *, guard: Guard, db: Sessions, services: WebServices, name: str
) -> ModelImportStatus:
    """The latest import of ``name``: running, completed (its checkpoint) or failed (why)."""
    await guard("read", "checkpoint", attrs={"name": name})
    workflow_id = model_import_workflow_id(name)
    progress = await services.orchestrator.model_import_progress(workflow_id)
    if progress is None:
        raise not_found("model import", name)
    checkpoint = None
    if progress.checkpoint_id is not None:
        checkpoint = await db.read(lineage.get_checkpoint, checkpoint_id=progress.checkpoint_id)
    return ModelImportStatus(name=name, workflow_id=workflow_id, status=progress.status,
                             stage=progress.stage, checkpoint=checkpoint,
                             problem=progress.problem, reasons=progress.reasons)
