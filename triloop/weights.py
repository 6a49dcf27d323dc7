"""Checkpoint weights are verified against their id (the sha256 of the weights) on every load.

A checkpoint's id is computed by the learning loop (``learning_loop.checkpoints``) as
the sha256 of the weights' canonical form: tensor names sorted; for each, a
length-prefixed header ``name NUL dtype NUL [shape]`` and the length-prefixed raw
little-endian bytes. ``safetensors_digest`` computes the same bytes from the files
alone, with the standard library: it reads the safetensors header (JSON) and streams
each tensor's byte range, so the execution loop (serving, eval) and governance (at
promotion's end) verify without torch and without trusting what the files claim.

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


def verify_weights(model_dir: Path, checkpoint_id: str) -> None:
    """Refuse (``WeightsIntegrityError``) unless the directory's weights hash to the id."""
    try:
        actual = safetensors_digest(model_dir)
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
