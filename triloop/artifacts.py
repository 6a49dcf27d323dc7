"""The content-addressed artifact store: blobs by sha256, a local directory or an S3 bucket.

One interface (``ArtifactStore``), two backends: ``LocalArtifactStore`` (files under
``root/sha256/<aa>/<digest>``, atomic renames) and ``triloop.s3_store.S3ArtifactStore``
(the same keys in an S3-compatible bucket, for workers on several machines). Every read
hashes what it got and refuses bytes that do not hash to the digest asked for
(``ArtifactCorrupted``), whichever backend served them.

A directory (a checkpoint: ``save_pretrained`` files plus trainer state) is stored as its
files' blobs plus a manifest blob, canonical JSON mapping each relative path to its file's
digest. Its URI is ``artifact://sha256/<manifest digest>``: immutable, and enough for any
worker to fetch it. Retention deletes a pruned checkpoint's weight and trainer-state
blobs (``delete``) and keeps its manifest, which still lists every file's digest.
``materialize`` writes it into a local cache folder keyed by that
digest (staged, then renamed), verifying every file on the way; the caller then verifies
the weights against the checkpoint id as for any local checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

ARTIFACT_SCHEME = "artifact"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20
MANIFEST_KIND = "triloop.directory/v1"


class ArtifactNotFound(KeyError):
    """No artifact with that digest."""


class ArtifactCorrupted(ValueError):
    """What the store returned does not hash to the digest that was asked for."""

    def __init__(self, digest: str, actual: str, where: str) -> None:
        super().__init__(f"artifact sha256 {digest} read from {where} hashes to {actual}; "
                         "the stored copy is corrupt or was replaced: restore it from a good copy")
        self.digest = digest
        self.actual = actual


class ArtifactStore(Protocol):
    """Put bytes or a file, get them back by digest; every read is verified."""

    location: str  # where the store is, for messages (a folder or s3://bucket/prefix)

    def put_bytes(self, data: bytes) -> str: ...
    def put_file(self, path: Path) -> str: ...
    def get_bytes(self, digest: str) -> bytes: ...
    def get_file(self, digest: str, target: Path) -> None: ...
    def exists(self, digest: str) -> bool: ...
    def delete(self, digest: str) -> None: ...


def check_digest(digest: str) -> str:
    """A lower-case hex sha256, or ValueError naming the bad value."""
    if not _DIGEST.match(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    return digest


def blob_key(digest: str) -> str:
    """The relative key of a blob: ``sha256/<first two hex>/<digest>``."""
    return f"sha256/{digest[:2]}/{check_digest(digest)}"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verified(digest: str, data: bytes, where: str) -> bytes:
    """``data`` if it hashes to ``digest``; otherwise ArtifactCorrupted."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise ArtifactCorrupted(digest, actual, where)
    return data


def write_verified(digest: str, chunks: Iterator[bytes], target: Path, where: str) -> None:
    """Stream ``chunks`` into ``target`` (atomically) only if they hash to ``digest``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".incoming-")
    hasher = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                hasher.update(chunk)
                handle.write(chunk)
        if hasher.hexdigest() != digest:
            raise ArtifactCorrupted(digest, hasher.hexdigest(), where)
        # mkstemp makes it 0600: the other workers sharing the store or cache read it too
        # (who may enter is the store's top folder's say, see triloop.devstack.accounts).
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class LocalArtifactStore:
    """Blobs under ``root/sha256/<aa>/<digest>``; writes are atomic renames."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root)

    def _location(self, digest: str) -> Path:
        return self.root / blob_key(digest)

    def put_file(self, path: Path) -> str:
        """Store a file's content; return its digest (idempotent)."""
        digest = sha256_file(path)
        target = self._location(digest)
        if not target.exists():
            with path.open("rb") as handle:
                write_verified(digest, iter(lambda: handle.read(_CHUNK), b""), target, str(path))
        return digest

    def put_bytes(self, data: bytes) -> str:
        """Store bytes; return their digest."""
        digest = hashlib.sha256(data).hexdigest()
        target = self._location(digest)
        if not target.exists():
            write_verified(digest, iter([data]), target, "memory")
        return digest

    def get_bytes(self, digest: str) -> bytes:
        """The blob's bytes, verified."""
        path = self.path_of(digest)
        return verified(digest, path.read_bytes(), str(path))

    def get_file(self, digest: str, target: Path) -> None:
        """Copy the blob to ``target``, verified."""
        path = self.path_of(digest)
        with path.open("rb") as handle:
            write_verified(digest, iter(lambda: handle.read(_CHUNK), b""), target, str(path))

    def path_of(self, digest: str) -> Path:
        """Where a stored artifact is; raises ArtifactNotFound naming the digest."""
        target = self._location(digest)
        if not target.exists():
            raise ArtifactNotFound(f"no artifact with sha256 {digest} under {self.root}")
        return target

    def exists(self, digest: str) -> bool:
        """Whether an artifact is stored."""
        return self._location(digest).exists()

    def delete(self, digest: str) -> None:
        """Remove a blob (retention); a blob already gone is not an error."""
        self._location(digest).unlink(missing_ok=True)


def directory_uri(manifest_digest: str) -> str:
    """The URI of a stored directory."""
    return f"{ARTIFACT_SCHEME}://sha256/{check_digest(manifest_digest)}"


def manifest_digest_of(uri: str) -> str:
    """The manifest digest an ``artifact://sha256/<digest>`` URI names."""
    prefix = f"{ARTIFACT_SCHEME}://sha256/"
    if not uri.startswith(prefix):
        raise ValueError(f"{uri!r} is not an {prefix}<digest> URI")
    return check_digest(uri[len(prefix):])


def publish_directory(store: ArtifactStore, directory: Path) -> str:
    """Store every file under ``directory`` and its manifest; the directory's URI."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        files[path.relative_to(directory).as_posix()] = store.put_file(path)
    manifest = json.dumps({"kind": MANIFEST_KIND, "files": files}, sort_keys=True,
                          separators=(",", ":")).encode()
    return directory_uri(store.put_bytes(manifest))


def materialize(store: ArtifactStore, uri: str, cache: Path, name: str = "content") -> Path:
    """A local copy of the stored directory ``uri``: ``cache/<manifest digest>/<name>``.

    Fetched once and verified file by file. ``name`` is what the directory must be called
    (a checkpoint's id: the learner checks that its directory is named by its weights).
    """
    digest = manifest_digest_of(uri)
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a directory name: {name!r}")
    target = cache / digest / name
    if target.is_dir():
        return target
    manifest = json.loads(store.get_bytes(digest))
    if not isinstance(manifest, dict) or manifest.get("kind") != MANIFEST_KIND:
        raise ValueError(f"artifact {digest} in {store.location} is not a directory manifest")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".incoming-"))
    os.chmod(staging, 0o755)  # as for blobs: the workers sharing the cache read it
    try:
        for relative, file_digest in manifest["files"].items():
            path = (staging / relative).resolve()
            if staging.resolve() not in path.parents:  # a manifest naming ../ escapes the cache
                raise ValueError(f"artifact {digest}: file path {relative!r} leaves the directory")
            store.get_file(file_digest, path)
        try:
            os.replace(staging, target)
        except OSError:  # another worker materialized it first: theirs is as good
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
