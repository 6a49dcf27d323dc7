"""Opens the configured shared artifact store (the one place that reads its settings)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from triloop.artifacts import ArtifactStore, LocalArtifactStore
from triloop.config import Settings
from triloop.s3_store import S3ArtifactStore, S3Credentials


def open_shared_store(settings: Settings) -> ArtifactStore | None:
    """The store checkpoints are published to, or None when artifacts stay on this machine.

    ``artifact_url``: ``s3://bucket/prefix`` (with ``artifact_s3_endpoint`` and keys) or
    ``file:///shared/folder`` (a filesystem every worker mounts).
    """
    if not settings.artifact_url:
        return None
    parsed = urlparse(settings.artifact_url)
    if parsed.scheme == "file":
        return LocalArtifactStore(Path(parsed.path))
    if parsed.scheme != "s3":
        raise ValueError(f"TRILOOP_ARTIFACT_URL {settings.artifact_url!r}: use s3://bucket/prefix"
                         " or file:///folder")
    missing = [name for name, value in (
        ("TRILOOP_ARTIFACT_S3_ENDPOINT", settings.artifact_s3_endpoint),
        ("TRILOOP_ARTIFACT_S3_ACCESS_KEY_ID", settings.artifact_s3_access_key_id),
        ("TRILOOP_ARTIFACT_S3_SECRET_ACCESS_KEY", settings.artifact_s3_secret_access_key),
    ) if not value]
    if missing:
        raise ValueError(f"TRILOOP_ARTIFACT_URL={settings.artifact_url} needs {', '.join(missing)}")
    return S3ArtifactStore(
        endpoint=str(settings.artifact_s3_endpoint), bucket=parsed.netloc, prefix=parsed.path,
        credentials=S3Credentials(str(settings.artifact_s3_access_key_id),
                                  str(settings.artifact_s3_secret_access_key),
                                  settings.artifact_s3_region))


def open_store(settings: Settings) -> ArtifactStore:
    """The shared store, or this machine's artifact folder when none is configured (one
    machine: the web service, governance and execution share ``Settings.artifacts``).

    Task sets' dataset files travel through it: the web service puts the uploaded file,
    the execution loop reads it to describe each row, governance reads it to write them.
    """
    return open_shared_store(settings) or LocalArtifactStore(settings.artifacts)
