"""Content-addressed artifact store (sha256). Local directory now; S3 behind the same API."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Protocol


class ArtifactNotFound(KeyError):
    """No artifact with that digest."""


class ArtifactStore(Protocol):
    """Put bytes or a directory, get them back by digest."""

    def put_file(self, path: Path) -> str: ...
    def path_of(self, digest: str) -> Path: ...
    def exists(self, digest: str) -> bool: ...


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class LocalArtifactStore:
    """Files under ``root/sha256/<aa>/<digest>``; writes are atomic renames."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _location(self, digest: str) -> Path:
        return self.root / "sha256" / digest[:2] / digest

    def put_file(self, path: Path) -> str:
        """Store a file's content; return its digest (idempotent)."""
        digest = sha256_file(path)
        target = self._location(digest)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent)
            os.close(fd)
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
        return digest

    def put_bytes(self, data: bytes) -> str:
        """Store bytes; return their digest."""
        digest = hashlib.sha256(data).hexdigest()
        target = self._location(digest)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, target)
        return digest

    def path_of(self, digest: str) -> Path:
        """Where a stored artifact is; raises ArtifactNotFound naming the digest."""
        target = self._location(digest)
        if not target.exists():
            raise ArtifactNotFound(f"no artifact with sha256 {digest} under {self.root}")
        return target

    def exists(self, digest: str) -> bool:
        """Whether an artifact is stored."""
        return self._location(digest).exists()
