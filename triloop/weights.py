"""Checkpoint weights are verified against their id (the sha256 of the weights) on every load.

A checkpoint's id is computed by the learning loop (``learning_loop.checkpoints``) as
the sha256 of the weights' canonical form: tensor names sorted; for each, a
length-prefixed header ``name NUL dtype NUL [shape]`` and the length-prefixed raw
little-endian bytes. ``safetensors_digest`` computes the same bytes from the files
alone, with the standard library: it reads the safetensors header (JSON) and streams
each tensor's byte range, so the execution loop (serving, eval) and governance (at
promotion's end) verify without torch and without trusting what the files claim.

A LoRA adapter checkpoint (a peft adapter directory: ``adapter_config.json`` and
``adapter_model.safetensors``) has its own id, ``adapter_digest``: the sha256 of a short
canonical text naming the base checkpoint's id (``base_model_name_or_path`` in the
adapter config, which the learner sets to it), the adapter settings that change what the
adapter computes (rank, alpha, targets, ...; canonical JSON) and the digest above of the
adapter's weights. The same adapter on another base, or scaled differently, is another
checkpoint; re-saving it gives the same id. ``checkpoint_digest`` picks the rule.

Every caller that loads weights to serve or judge them calls ``verify_weights`` first;
a mismatch is a ``WeightsIntegrityError`` naming the checkpoint, and the caller
records it with ``record_integrity_event`` in the audit log.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlparse

from sqlalchemy import Engine

from triloop.artifacts import ARTIFACT_SCHEME, ArtifactStore, materialize
from triloop.audit import record_event

INTEGRITY_ACTION = "integrity_violation"
_CHUNK = 1 << 20
# safetensors dtype -> the torch dtype name the learning loop's digest writes.
_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2", "F8_E5M2FNUZ": "float8_e5m2fnuz", "C64": "complex64",
}


class WeightsIntegrityError(RuntimeError):
    """A checkpoint's weights are not the ones its id names (or cannot be read to check)."""

    def __init__(self, checkpoint_id: str, model_dir: Path, problem: str) -> None:
        super().__init__(
            f"checkpoint {checkpoint_id} refused: {problem} in {model_dir}; its weights are not "
            "the ones that were evaluated. Restore the checkpoint's files or propose a new one"
        )
        self.checkpoint_id = checkpoint_id
        self.model_dir = model_dir
        self.problem = problem


class UnsupportedArtifactUri(ValueError):
    """A checkpoint's artifact_uri this process cannot open as a local directory."""


def checkpoint_dir(
    artifact_uri: str, *, home: Path, store: ArtifactStore | None = None,
    checkpoint_id: str = "content", cache: Path | None = None,
) -> Path:
    """The local directory of a checkpoint: ``file://`` URIs, paths (relative to home), or
    ``artifact://sha256/<manifest>`` fetched from the shared ``store`` into ``cache``
    (default ``home/artifact-cache``; every file verified against its sha256 on the way).

    The one place a checkpoint URI becomes a path: the execution loop (to serve it) and
    the learning loop (to train from it) resolve the same row the same way."""
    parsed = urlparse(artifact_uri)
    if parsed.scheme == ARTIFACT_SCHEME:
        if store is None:
            raise UnsupportedArtifactUri(
                f"checkpoint artifact_uri {artifact_uri!r} is in the shared artifact store, "
                "which this process has not been given: set TRILOOP_ARTIFACT_URL")
        return materialize(store, artifact_uri, cache or home / "artifact-cache", checkpoint_id)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "":
        path = Path(artifact_uri)
        return path if path.is_absolute() else home / path
    raise UnsupportedArtifactUri(
        f"checkpoint artifact_uri {artifact_uri!r} has scheme {parsed.scheme!r}; this worker "
        "opens file:// URIs, local paths and artifact:// URIs of the shared store"
    )


def _header(handle: BinaryIO, file: Path) -> tuple[int, dict[str, Any]]:
    """(offset of the data buffer, the tensors' header entries) of one safetensors file."""
    size_bytes = handle.read(8)
    if len(size_bytes) != 8:
        raise ValueError(f"{file.name} is too short to be a safetensors file")
    (size,) = struct.unpack("<Q", size_bytes)
    if size > file.stat().st_size - 8:
        raise ValueError(f"{file.name} declares a header longer than the file")
    header = json.loads(handle.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{file.name} has a malformed safetensors header")
    header.pop("__metadata__", None)
    return 8 + size, header


def _update_with_tensor(
    digest: Any, handle: BinaryIO, name: str, entry: Mapping[str, Any], data_start: int,
    data_end: int,
) -> None:
    dtype = _DTYPES.get(str(entry.get("dtype")))
    if dtype is None:
        raise ValueError(f"tensor {name!r} has an unknown dtype {entry.get('dtype')!r}")
    shape = [int(d) for d in entry["shape"]]
    begin, end = (int(o) for o in entry["data_offsets"])
    if not 0 <= begin <= end or data_start + end > data_end:
        raise ValueError(f"tensor {name!r} points outside its file")
    header = f"{name}\0{dtype}\0{shape}".encode()
    digest.update(struct.pack("<Q", len(header)) + header)
    digest.update(struct.pack("<Q", end - begin))
    handle.seek(data_start + begin)
    left = end - begin
    while left:
        chunk = handle.read(min(_CHUNK, left))
        if not chunk:
            raise ValueError(f"tensor {name!r} is cut short")
        digest.update(chunk)
        left -= len(chunk)


def safetensors_digest(model_dir: Path) -> str:
    """The checkpoint id of the ``*.safetensors`` files in a model directory.

    Byte for byte what the learning loop computes from the tensors in memory when it saves
    a checkpoint (``weights_digest``), which also reads saved checkpoints back through this
    function; later files win for a name present in two files.
    """
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError("no *.safetensors weights")
    owner: dict[str, tuple[Path, dict[str, Any], int]] = {}
    for file in files:
        with file.open("rb") as handle:
            data_start, header = _header(handle, file)
        for name, entry in header.items():
            owner[name] = (file, entry, data_start)
    digest = hashlib.sha256()
    handles: dict[Path, BinaryIO] = {}
    try:
        for name in sorted(owner):
            file, entry, data_start = owner[name]
            if file not in handles:
                handles[file] = file.open("rb")
            _update_with_tensor(digest, handles[file], name, entry, data_start,
                                file.stat().st_size)
    finally:
        for reader in handles.values():
            reader.close()
    return digest.hexdigest()


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_ID_VERSION = "triloop-lora-adapter/1"
# The adapter_config.json keys that change the function an adapter computes (tensor names
# and shapes already carry the layers and the rank). Bookkeeping (peft version, paths,
# inference mode, dropout, which only acts while training) stays out of the id.
ADAPTER_FUNCTION_KEYS = (
    "r", "lora_alpha", "use_rslora", "use_dora", "bias", "fan_in_fan_out", "rank_pattern",
    "alpha_pattern", "modules_to_save", "target_modules", "layers_to_transform",
)


def is_adapter_dir(model_dir: Path) -> bool:
    """Whether the directory holds a peft adapter rather than full weights."""
    return (model_dir / ADAPTER_CONFIG).is_file()


def adapter_config(model_dir: Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json``, checked to be a JSON object."""
    data = json.loads((model_dir / ADAPTER_CONFIG).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{ADAPTER_CONFIG} is not a JSON object")
    return data


def adapter_base_id(model_dir: Path) -> str:
    """The id of the base checkpoint an adapter directory applies to."""
    base = adapter_config(model_dir).get("base_model_name_or_path")
    if not isinstance(base, str) or len(base) != 64 or any(c not in "0123456789abcdef"
                                                           for c in base):
        raise ValueError(
            f"{ADAPTER_CONFIG} names no base checkpoint id (base_model_name_or_path is "
            f"{base!r}); triloop's adapters name their base's sha256 id there")
    return base


def adapter_digest(model_dir: Path) -> str:
    """The checkpoint id of a peft adapter directory (see the module docstring)."""
    config = adapter_config(model_dir)
    function = {key: config.get(key) for key in ADAPTER_FUNCTION_KEYS}
    targets = function["target_modules"]
    if isinstance(targets, list):  # a set in peft: its order is not the adapter's
        function["target_modules"] = sorted(str(t) for t in targets)
    text = (f"{ADAPTER_ID_VERSION}\nbase {adapter_base_id(model_dir)}\n"
            f"config {json.dumps(function, sort_keys=True, separators=(',', ':'))}\n"
            f"weights {safetensors_digest(model_dir)}\n")
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint_digest(model_dir: Path) -> str:
    """The checkpoint id of a directory: an adapter's by its rule, full weights' by theirs."""
    if is_adapter_dir(model_dir):
        return adapter_digest(model_dir)
    return safetensors_digest(model_dir)


def verify_weights(model_dir: Path, checkpoint_id: str) -> None:
    """Refuse (``WeightsIntegrityError``) unless the directory's weights hash to the id."""
    try:
        actual = checkpoint_digest(model_dir)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise WeightsIntegrityError(checkpoint_id, model_dir,
                                    f"the weights cannot be read to verify ({error})") from error
    if actual != checkpoint_id:
        raise WeightsIntegrityError(checkpoint_id, model_dir,
                                    f"the weights hash to {actual}")


def record_integrity_event(
    engine: Engine, *, service: str, error: WeightsIntegrityError, during: str,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Append an integrity event (a checkpoint whose weights do not match its id)."""
    record_event(
        engine,
        actor={"service": service, "roles": []},
        action=INTEGRITY_ACTION,
        resource={"kind": "checkpoint", "id": error.checkpoint_id},
        payload={"during": during, "problem": error.problem,
                 "directory": str(error.model_dir), **(extra or {})},
    )
