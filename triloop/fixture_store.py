"""An environment version's fixture files in the artifact store, by the hashes it pins.

Governance registers a contract uploaded with its fixtures (``triloop.contract_upload``):
it puts each fixture file's bytes in the content-addressed artifact store
(``publish_fixtures``) before it writes the version row, so every version registered that
way has its fixtures there, keyed by the sha256 the version pins (``fixture_hashes``).
The execution loop lays them out for a task (``fixture_folder``): each file fetched by its
hash (every read is verified), written under ``<cache>/<version id>/``, and the contract is
parsed from that folder, so an uploaded agent program or repository is what runs. A version
whose fixtures all match the built-in contracts folder (the shipped environments, or a
version registered before fixtures were published) keeps using that folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from triloop.artifacts import ArtifactNotFound, ArtifactStore


class FixturesMissing(LookupError):
    """A pinned fixture is in neither the artifact store nor the built-in folder."""


def publish_fixtures(store: ArtifactStore, files: Mapping[str, bytes],
                     pinned: Mapping[str, str]) -> None:
    """Put each pinned fixture's bytes in the store (content-addressed, so idempotent)."""
    for name, digest in sorted(pinned.items()):
        data = files.get(name)
        if data is None:
            raise FixturesMissing(f"fixture {name} (sha256 {digest}) was not given to publish")
        stored = store.put_bytes(data)
        if stored != digest:  # the pinned hash is of other bytes: never store under it
            raise ValueError(f"fixture {name} hashes to {stored}, the version pins {digest}")


def _matches(folder: Path, pinned: Mapping[str, str]) -> bool:
    for name, digest in pinned.items():
        path = folder / name
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            return False
    return True


def _relative(name: str) -> PurePosixPath:
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise ValueError(f"fixture path {name!r} leaves the contract's folder")
    return pure


def fixture_folder(
    *, version_id: str, pinned: Mapping[str, str], builtin: Path, store: ArtifactStore | None,
    cache: Path,
) -> Path:
    """The folder to parse the version's contract from, with exactly its pinned fixtures.

    ``builtin`` when every pinned file there hashes as pinned; otherwise
    ``cache/<version id>`` laid out from the store (verified), reused while it still
    matches. ``FixturesMissing`` names a fixture found in neither place.
    """
    if not pinned or _matches(builtin, pinned):
        return builtin
    target = cache / version_id
    if target.is_dir() and _matches(target, pinned):
        return target
    if store is None:
        raise FixturesMissing(f"environment version {version_id}'s fixtures are not in the"
                              f" built-in folder {builtin}, and no artifact store is open")
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version_id[:12]}-", dir=cache))
    try:
        for name, digest in sorted(pinned.items()):
            try:
                data = store.get_bytes(digest)  # verified: bytes that hash to the digest
            except ArtifactNotFound as exc:
                raise FixturesMissing(
                    f"fixture {name} (sha256 {digest}) of environment version {version_id} is"
                    f" not in the artifact store at {store.location} nor, with that hash, in"
                    f" {builtin}: register the contract with its fixtures again") from exc
            path = staging / _relative(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        shutil.rmtree(target, ignore_errors=True)  # a stale copy that no longer matches
        try:
            os.rename(staging, target)
        except OSError:  # another worker laid it out meanwhile: use theirs if it matches
            if not _matches(target, pinned):
                raise
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)
