"""Content-addressed checkpoints: safetensors weights plus everything needed to resume.

Layout under the artifact directory:

    <artifact_dir>/checkpoints/<id>/config.json, model.safetensors, ...   save_pretrained
    <artifact_dir>/checkpoints/<id>/trainer_state.pt   optimizer, scheduler, RNG, data cursor

The model directory (with the tokenizer, when given) loads with `from_pretrained` and can
be served by vLLM as it is.
The id is the sha256 of the weights' canonical form (tensor names sorted; for each its
name, dtype, shape and raw bytes), so it depends on tensor contents only: not on file
layout, metadata or save order, and saving identical weights twice gives the same id.

Writes go to a temporary directory that is renamed into place, so a worker killed
mid-save leaves no half checkpoint under an id. Saving weights that already exist
keeps the weights and replaces `trainer_state.pt` (e.g. an iteration that dropped all
its samples moved the data cursor, not the weights).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file

from triloop.weights import checkpoint_digest

TRAINER_STATE = "trainer_state.pt"
_FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be saved or loaded; the message names it and says why."""


class SavableModel(Protocol):
    """What a checkpoint needs from a model: a Hugging Face PreTrainedModel satisfies it."""

    def save_pretrained(self, save_directory: str | os.PathLike[str]) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any: ...


class SavableTokenizer(Protocol):
    """A tokenizer that writes its files into a directory (PreTrainedTokenizerBase does)."""

    def save_pretrained(self, save_directory: str | os.PathLike[str]) -> Any: ...


@dataclass(frozen=True)
class CheckpointRef:
    """A saved checkpoint: its content id and its directory."""

    id: str
    path: Path


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What `load_checkpoint` restored besides the tensors it loaded in place."""

    ref: CheckpointRef
    data_cursor: dict[str, Any]
    metadata: dict[str, Any]


def weights_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over sorted names and, for each tensor, its dtype, shape and raw bytes."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        header = f"{name}\0{str(tensor.dtype).removeprefix('torch.')}\0{list(tensor.shape)}"
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        # Length-prefix both parts so no two different tensor sets hash the same stream.
        digest.update(struct.pack("<Q", len(header)) + header.encode())
        digest.update(struct.pack("<Q", len(raw)) + raw)
    return digest.hexdigest()


def saved_weights_digest(model_dir: Path) -> str:
    """The checkpoint id of a saved model (or LoRA adapter) directory.

    One definition with the serving side's check (``triloop.weights``), which streams the
    files instead of loading every tensor.
    """
    try:
        return checkpoint_digest(model_dir)
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{model_dir}: {exc}") from exc


def save_checkpoint(
    artifact_dir: Path,
    model: SavableModel,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    *,
    tokenizer: SavableTokenizer | None = None,
    data_cursor: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> CheckpointRef:
    """Save weights and trainer state under `<artifact_dir>/checkpoints/<id>/`.

    Pass the tokenizer so the directory is self-contained for vLLM; its files do not
    enter the id.
    """
    root = artifact_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        checkpoint_id = saved_weights_digest(staging)
        state = _trainer_state(optimizer, scheduler, data_cursor, metadata)
        torch.save(state, staging / TRAINER_STATE)
        readable_by_readers(staging)
        final = root / checkpoint_id
        try:
            os.rename(staging, final)
        except OSError:
            # Those weights are saved already (maybe by a racing writer): keep them, and
            # let this newer trainer state win.
            if not (final / TRAINER_STATE).is_file():
                raise
            os.replace(staging / TRAINER_STATE, final / TRAINER_STATE)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return CheckpointRef(id=checkpoint_id, path=final)


def readable_by_readers(directory: Path) -> None:
    """Folders 0755 and files 0644 under ``directory``, whatever wrote them.

    ``mkdtemp`` makes the folder 0700 and the weights' writer its file 0600, but the
    execution and governance workers, other OS users in the artifact store's group, read
    checkpoints too (``triloop.devstack.accounts``). Who may enter the store at all is
    the store's top folder's say, not each file's.
    """
    os.chmod(directory, 0o755)
    for parent, folders, files in os.walk(directory):
        for name in folders:
            os.chmod(os.path.join(parent, name), 0o755)
        for name in files:
            os.chmod(os.path.join(parent, name), 0o644)


def load_checkpoint(
    path: Path,
    model: SavableModel,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    *,
    restore_rng: bool = True,
    verify: bool = True,
) -> LoadedCheckpoint:
    """Load weights into `model` in place and restore optimizer, scheduler, RNG and cursor."""
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory at {path}")
    checkpoint_id = saved_weights_digest(path)
    if verify and checkpoint_id != path.name:
        raise CheckpointError(
            f"weights in {path} hash to {checkpoint_id}, not to the directory's id {path.name};"
            " the checkpoint was modified or is not content-addressed"
        )
    _load_weights(path, model)
    state_file = path / TRAINER_STATE
    if not state_file.is_file():
        raise CheckpointError(f"{path} has no {TRAINER_STATE}; it cannot be resumed from")
    # weights_only: a checkpoint is data; never let it run code on load.
    state = torch.load(state_file, map_location="cpu", weights_only=True)
    if state.get("format_version") != _FORMAT_VERSION:
        raise CheckpointError(f"{state_file}: unsupported format {state.get('format_version')}")
    if optimizer is not None:
        if state["optimizer"] is None:
            raise CheckpointError(f"{path} was saved without optimizer state")
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        if state["scheduler"] is None:
            raise CheckpointError(f"{path} was saved without scheduler state")
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        restore_rng_state(state["rng"])
    return LoadedCheckpoint(
        ref=CheckpointRef(id=checkpoint_id, path=path),
        data_cursor=dict(state["data_cursor"]),
        metadata=dict(state["metadata"]),
    )


def annotate_checkpoint(ref: CheckpointRef, metadata: Mapping[str, Any]) -> CheckpointRef:
    """Replace the metadata kept in a saved checkpoint's trainer state (weights untouched).

    For a checkpoint saved before its metadata was known (rank 0 of a multi-rank update
    saves the weights; the iteration's records come after). The new state is written
    beside the old and renamed over it, so a reader sees the old file or the new one.
    """
    state_file = ref.path / TRAINER_STATE
    if not state_file.is_file():
        raise CheckpointError(f"{ref.path} has no {TRAINER_STATE} to annotate")
    state = torch.load(state_file, map_location="cpu", weights_only=True)
    state["metadata"] = dict(metadata)
    fd, staging = tempfile.mkstemp(prefix=".staging-", suffix=".pt", dir=ref.path)
    os.close(fd)
    try:
        torch.save(state, staging)
        os.chmod(staging, 0o644)  # as every checkpoint file: see readable_by_readers
        os.replace(staging, state_file)
    finally:
        Path(staging).unlink(missing_ok=True)
    return ref


def _trainer_state(
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    data_cursor: Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None,
) -> dict[str, Any]:
    return {
        "format_version": _FORMAT_VERSION,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
        "data_cursor": dict(data_cursor or {}),
        "metadata": dict(metadata or {}),
    }


def rng_state() -> dict[str, Any]:
    """The process's RNG state as a checkpoint saves it (python, torch, CUDA)."""
    rng: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng_state(rng: Mapping[str, Any]) -> None:
    """Put back a state ``rng_state`` took (or a checkpoint saved)."""
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _load_weights(path: Path, model: SavableModel) -> None:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected:
        raise CheckpointError(f"{path} has weights the model lacks: {sorted(unexpected)[:5]}")
    # save_pretrained drops tied copies (lm_head = embeddings); those may be missing, but
    # only if they share storage with a tensor that was loaded.
    current = model.state_dict()
    loaded_ptrs = {current[name].data_ptr() for name in tensors}
    untied = [name for name in missing if current[name].data_ptr() not in loaded_ptrs]
    if untied:
        raise CheckpointError(f"{path} lacks weights the model needs: {sorted(untied)[:5]}")


TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json",
)


@dataclass(frozen=True)
class ServingHashes:
    """What a checkpoint's weights are served with, for its lineage row (sha256 hex each)."""

    tokenizer_sha256: str | None  # the tokenizer files present, as sorted name/hash lines
    model_config_sha256: str | None  # config.json as canonical JSON, without the writer's version
    chat_template_sha256: str | None  # the chat template's text; None: the model has none


def serving_hashes(model_dir: Path) -> ServingHashes:
    """Hash the tokenizer, model config and chat template saved in ``model_dir``."""
    present = [n for n in TOKENIZER_FILES if (model_dir / n).is_file()]
    tokenizer = (
        hashlib.sha256("".join(
            f"{n} {hashlib.sha256((model_dir / n).read_bytes()).hexdigest()}\n" for n in present
        ).encode()).hexdigest() if present else None
    )
    config = None
    if (model_dir / "config.json").is_file():
        data = json.loads((model_dir / "config.json").read_text())
        data.pop("transformers_version", None)  # the library that wrote it, not the model
        config = hashlib.sha256(
            json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
    template: str | None = None
    if (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text()
    elif (model_dir / "tokenizer_config.json").is_file():
        found = json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template")
        template = found if isinstance(found, str) else (json.dumps(found) if found else None)
    chat = hashlib.sha256(template.encode()).hexdigest() if template else None
    return ServingHashes(tokenizer, config, chat)
