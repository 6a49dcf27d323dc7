"""Activities on ``learning-gpu`` that register base models: a run's, and a person's import.

Both end in one place, ``BaseActivities._store_base``: the model, loaded in float32 on the
CPU, is saved content-addressed into the artifact store exactly as the learner saves a
checkpoint (its id is the same weights digest), published to the shared store when there
is one, and inserted as a root checkpoint row with its serving hashes and facts.

``register_base_checkpoint`` is the run's: ``model.base`` is a registered id, or a model
directory registered on first use. ``import_model`` is a person's import through the web
service (``ModelImportWorkflow``): it checks the source first (``model_import.
inspect_source``; a bad one fails with ``InvalidRequest`` and registers nothing), asks the
policy, then converts and registers it under the person's name for it. A failure after
the weights were saved removes them unless a row names them.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import torch
from sqlalchemy import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError
from transformers import PreTrainedModel

from learning_loop.checkpoints import saved_weights_digest, serving_hashes
from learning_loop.contracts import (
    BASE_MODEL_NOT_FOUND,
    IMPORT_MODEL,
    REGISTER_BASE_CHECKPOINT,
    BaseCheckpoint,
    RegisterBaseInput,
)
from learning_loop.iteration import load_model, save_servable
from learning_loop.model_import import (
    STORED_DTYPE,
    ModelImportError,
    example_path,
    inspect_source,
    load_for_import,
    parameter_count,
    safetensors_dtypes,
    weight_files,
)
from learning_loop.store import (
    BaseFacts,
    CheckpointNameTaken,
    checkpoint_named,
    get_checkpoint,
    register_root,
)
from triloop.artifacts import ArtifactStore, publish_directory
from triloop.models import Checkpoint
from triloop.policy import Actor, Authorizer, PolicyDenied, Resource
from triloop.workflow_api import ErrorType, ModelImportInput, ModelImportResult

LEARNING = Actor(service="learning")
T = TypeVar("T")


def checkpoint_uri(store: ArtifactStore | None, directory: Path) -> str:
    """The URI recorded for a saved checkpoint: the shared store's, or this machine's."""
    if store is None:
        return directory.resolve().as_uri()
    return publish_directory(store, directory)


class BaseActivities:
    """Base-model registration, bound to the learning role's engine, the policy and artifacts."""

    def __init__(self, *, engine: Engine, authorizer: Authorizer, artifact_dir: Path,
                 store: ArtifactStore | None = None) -> None:
        self._engine = engine
        self._authorizer = authorizer
        self._artifact_dir = artifact_dir
        self._shared_store = store

    @activity.defn(name=REGISTER_BASE_CHECKPOINT.name)
    def register_base_checkpoint(self, request: RegisterBaseInput) -> BaseCheckpoint:
        """The base model as a root checkpoint: a registered id, or a directory to copy in."""
        existing = get_checkpoint(engine=self._engine, checkpoint_id=request.base)
        if existing is not None:
            return BaseCheckpoint(existing.id, created=False)
        source = Path(request.base)
        if not (source / "config.json").is_file():
            raise ApplicationError(
                f"model.base {request.base!r} is neither a registered checkpoint id nor a Hugging"
                " Face model directory (config.json) on the learning worker; create one with"
                " `triloop model init-tiny DIR`, import one with `triloop model import`, or"
                " name a checkpoint",
                type=BASE_MODEL_NOT_FOUND, non_retryable=True,
            )
        digest = saved_weights_digest(source)
        if get_checkpoint(engine=self._engine, checkpoint_id=digest) is not None:
            return BaseCheckpoint(digest, created=False)
        self._authorizer.authorize(LEARNING, "create", Resource(
            "checkpoint", id=digest, attrs={"run_id": request.run_id, "source": str(source)}
        ))
        # CPU: the base is only copied into the artifact store here, not trained.
        model = load_model(source, torch.device("cpu"))
        dtypes = safetensors_dtypes(weight_files(source))
        facts = BaseFacts(source_kind="huggingface", parameter_count=parameter_count(model),
                          source_dtype=next(iter(dtypes)) if len(dtypes) == 1 else "mixed",
                          dtype=STORED_DTYPE)
        checkpoint_id, created = self._store_base(model, source, str(source.resolve()), facts)
        return BaseCheckpoint(checkpoint_id, created=created)

    @activity.defn(name=IMPORT_MODEL.name)
    async def import_model(self, request: ModelImportInput) -> ModelImportResult:
        """Check, convert and register a person's model import, heartbeating its stage."""
        stage = ["checking"]
        try:
            return await _heartbeating(lambda: self._import(request, stage),
                                       lambda: {"stage": stage[0]})
        except ModelImportError as exc:
            raise ApplicationError(str(exc), [str(exc)], type=ErrorType.INVALID_REQUEST,
                                   non_retryable=True) from exc
        except PolicyDenied as exc:
            raise ApplicationError(str(exc), type=ErrorType.POLICY_DENIED,
                                   non_retryable=True) from exc

    def _import(self, request: ModelImportInput, stage: list[str]) -> ModelImportResult:
        if bool(request.source) == bool(request.example):
            raise ModelImportError("name exactly one of a source path or an example model")
        path = example_path(request.example) if request.example else Path(request.source)
        named = checkpoint_named(engine=self._engine, name=request.name)
        if named is not None:  # a retry after the row was written finds its own row
            if named.data.get("source") == str(path.resolve()):
                return _result(named, created=False)
            raise ModelImportError(f"the name {request.name!r} is taken by checkpoint"
                                   f" {named.id}; choose another with --name")
        source = inspect_source(path)
        self._authorizer.authorize(LEARNING, "create", Resource("checkpoint", attrs={
            "name": request.name, "source": str(path), "source_kind": source.kind,
            "requested_by": request.requested_by}))
        stage[0] = "loading"
        with tempfile.TemporaryDirectory(prefix=".import-", dir=self._staging_root()) as side:
            model = load_for_import(source, Path(side))
            facts = BaseFacts(source_kind=source.kind, parameter_count=parameter_count(model),
                              source_dtype=source.source_dtype, dtype=STORED_DTYPE,
                              name=request.name)
            stage[0] = "saving"
            try:
                checkpoint_id, created = self._store_base(model, Path(side),
                                                          str(path.resolve()), facts)
            except CheckpointNameTaken as exc:
                raise ModelImportError(f"{exc}; choose another with --name") from exc
        row = get_checkpoint(engine=self._engine, checkpoint_id=checkpoint_id)
        assert row is not None
        if row.name != request.name:
            raise ModelImportError(
                f"these weights are already registered as checkpoint {row.id}"
                f" ({f'named {row.name!r}' if row.name else 'without a name'}); name that"
                " checkpoint in RUN.yaml instead of importing it again")
        return _result(row, created=created)

    def _staging_root(self) -> Path:
        root = self._artifact_dir / "checkpoints"
        root.mkdir(parents=True, exist_ok=True)
        return root

    def _store_base(self, model: PreTrainedModel, side_dir: Path, source: str,
                    facts: BaseFacts) -> tuple[str, bool]:
        """Save the model as a root checkpoint and insert its row; (id, newly inserted)."""
        ref = save_servable(self._artifact_dir, model, side_dir, data_cursor={},
                            metadata={"source": source, "source_kind": facts.source_kind})
        try:
            created = register_root(engine=self._engine, checkpoint_id=ref.id,
                                    artifact_uri=checkpoint_uri(self._shared_store, ref.path),
                                    source=source, serving=asdict(serving_hashes(ref.path)),
                                    facts=facts)
        except BaseException:
            # Nothing may stay behind for a refused base, unless a row already names it.
            if get_checkpoint(engine=self._engine, checkpoint_id=ref.id) is None:
                shutil.rmtree(ref.path, ignore_errors=True)
            raise
        return ref.id, created


def _result(row: Checkpoint, *, created: bool) -> ModelImportResult:
    return ModelImportResult(
        checkpoint_id=row.id, name=row.name or "", source_kind=row.source_kind or "",
        parameter_count=row.parameter_count or 0, source_dtype=row.source_dtype or "",
        dtype=row.dtype or "", created=created)


async def _heartbeating(work: Callable[[], T], details: Callable[[], dict[str, Any]]) -> T:
    """Run blocking ``work`` in a thread, heartbeating ``details()`` until it returns."""
    timeout = activity.info().heartbeat_timeout
    interval = max(0.5, timeout.total_seconds() / 4) if timeout else 10.0
    job = asyncio.ensure_future(asyncio.to_thread(work))
    while True:
        done, _ = await asyncio.wait({job}, timeout=interval)
        if done:
            return job.result()
        activity.heartbeat(details())
