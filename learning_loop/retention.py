"""Checkpoint retention: after an iteration is stored, older iterations give up their files.

Every iteration saves full weights plus optimizer state (for a 135M-parameter model in
fp32, about 0.5 GB of weights and 1.1 GB of Adam moments), so a run would fill any disk.
Retention keeps the files of what may still be needed and deletes the rest:

1. ``store.prune_checkpoints`` asks the database (``triloop_prune_checkpoints``, migration
   0026) which of the run's checkpoints may go, and marks them pruned in one transaction.
   Only the database can answer: what protects a checkpoint (production, rollback targets,
   routing, open promotions) is in tables the learning role may not read.
2. Then the files go: the learner's own copy under ``<artifact_dir>/checkpoints/<id>``,
   its verified cache of a shared-store copy, and in the shared store the weight and
   trainer-state blobs that no kept checkpoint's manifest lists. The manifest and the small
   files (config, tokenizer: shared by a lineage, content-addressed) stay.

Mark first, delete second: a crash in between leaves a marked row whose files still
exist (harmless; the next call lists it again and finishes), never a row that claims
weights that are gone. A ``file://`` checkpoint outside the artifact directory (a base
model a person pointed at) is never deleted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from sqlalchemy import Engine

from learning_loop.store import PrunedCheckpoint, kept_artifact_uris, prune_checkpoints
from triloop.artifacts import (
    ARTIFACT_SCHEME,
    MANIFEST_KIND,
    ArtifactNotFound,
    ArtifactStore,
    manifest_digest_of,
)

# The files that make a checkpoint large and are its own: weights and trainer state.
_BULKY_SUFFIXES = (".safetensors", ".safetensors.index.json", ".pt", ".bin")


@dataclass(frozen=True)
class PruneReport:
    """What one retention pass did for a run."""

    run_id: str
    keep_last: int
    pruned: list[PrunedCheckpoint]  # every pruned checkpoint of the run (new and earlier)
    freed_bytes: int  # bytes of files deleted by this pass (0 on a dry run)
    dry_run: bool = False

    @property
    def newly_pruned(self) -> list[PrunedCheckpoint]:
        """The checkpoints this pass marked."""
        return [p for p in self.pruned if p.newly]


class CheckpointFiles:
    """Deletes a pruned checkpoint's files wherever this learner put them."""

    def __init__(self, *, artifact_dir: Path, store: ArtifactStore | None = None,
                 cache_dir: Path | None = None) -> None:
        self._checkpoints = (artifact_dir / "checkpoints").resolve()
        self._store = store
        self._cache = cache_dir
        self._manifests: dict[str, dict[str, str]] = {}  # immutable: content-addressed

    def delete(self, pruned: Sequence[PrunedCheckpoint], *, kept_uris: Iterable[str] = ()
               ) -> int:
        """Delete the files of ``pruned``; the bytes freed. Blobs a kept manifest lists stay."""
        if not pruned:
            return 0
        freed = 0
        kept_blobs: set[str] | None = None
        for checkpoint in pruned:
            freed += _remove_tree(self._checkpoints / checkpoint.checkpoint_id)
            freed += self._remove_file_uri(checkpoint.artifact_uri)
            if urlparse(checkpoint.artifact_uri).scheme != ARTIFACT_SCHEME:
                continue
            digest = manifest_digest_of(checkpoint.artifact_uri)
            if self._cache is not None:
                freed += _remove_tree(self._cache / digest)
            if self._store is None:
                continue
            if kept_blobs is None:
                kept_blobs = self._blobs_of(kept_uris)
            for name, blob in self._manifest(digest).items():
                if name.endswith(_BULKY_SUFFIXES) and blob not in kept_blobs:
                    self._store.delete(blob)
        return freed

    def _remove_file_uri(self, uri: str) -> int:
        parsed = urlparse(uri)
        if parsed.scheme != "file":
            return 0
        path = Path(unquote(parsed.path)).resolve()
        if path.parent != self._checkpoints:  # not one this learner wrote: leave it alone
            return 0
        return _remove_tree(path)

    def _manifest(self, digest: str) -> dict[str, str]:
        if digest not in self._manifests:
            assert self._store is not None
            try:
                data = json.loads(self._store.get_bytes(digest))
            except ArtifactNotFound:
                data = {"kind": MANIFEST_KIND, "files": {}}
            files = data.get("files") if isinstance(data, dict) else None
            self._manifests[digest] = dict(files) if isinstance(files, dict) else {}
        return self._manifests[digest]

    def _blobs_of(self, uris: Iterable[str]) -> set[str]:
        blobs: set[str] = set()
        for uri in uris:
            if urlparse(uri).scheme == ARTIFACT_SCHEME:
                blobs.update(self._manifest(manifest_digest_of(uri)).values())
        return blobs


def prune_run(
    *, engine: Engine, files: CheckpointFiles, run_id: str, keep_last: int,
    retain: Sequence[str] = (), dry_run: bool = False,
) -> PruneReport:
    """Mark the run's prunable checkpoints in the database, then delete their files."""
    pruned = prune_checkpoints(engine=engine, run_id=run_id, keep_last=keep_last,
                               retain=retain, dry_run=dry_run)
    if dry_run:
        return PruneReport(run_id, keep_last, pruned, 0, dry_run=True)
    freed = files.delete(pruned, kept_uris=kept_artifact_uris(engine=engine)
                         if any(p.artifact_uri.startswith(f"{ARTIFACT_SCHEME}:") for p in pruned)
                         else ())
    return PruneReport(run_id, keep_last, pruned, freed)


def directory_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 if it does not exist)."""
    if not path.exists():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _remove_tree(path: Path) -> int:
    if not path.is_dir():
        return 0
    size = directory_bytes(path)
    shutil.rmtree(path)
    return size
