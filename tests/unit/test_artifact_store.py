"""The content-addressed artifact store: every read is verified; directories by manifest."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from triloop.artifacts import (
    ArtifactCorrupted,
    ArtifactNotFound,
    LocalArtifactStore,
    blob_key,
    manifest_digest_of,
    materialize,
    publish_directory,
)
from triloop.config import Settings
from triloop.s3_store import S3ArtifactStore, S3Credentials, sign_v4
from triloop.weights import UnsupportedArtifactUri, checkpoint_dir


def _tree(root: Path) -> Path:
    (root / "nested").mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}')
    (root / "nested" / "weights.bin").write_bytes(bytes(range(256)) * 64)
    return root


def test_blobs_round_trip_and_corruption_is_refused_on_every_read(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    digest = store.put_bytes(b"checkpoint bytes")
    assert store.put_bytes(b"checkpoint bytes") == digest  # idempotent
    assert store.get_bytes(digest) == b"checkpoint bytes"
    store.path_of(digest).write_bytes(b"checkpoint bytez")  # bit rot, or a swap
    with pytest.raises(ArtifactCorrupted, match=f"sha256 {digest}"):
        store.get_bytes(digest)
    target = tmp_path / "out" / "file"
    with pytest.raises(ArtifactCorrupted):
        store.get_file(digest, target)
    assert not target.exists()  # nothing half-written is left behind
    with pytest.raises(ArtifactNotFound, match="no artifact with sha256"):
        store.get_bytes("0" * 64)
    with pytest.raises(ValueError, match="not a sha256"):
        store.exists("../../etc/passwd")


def test_a_directory_is_published_once_and_read_back_verified(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    source = _tree(tmp_path / "ckpt")
    uri = publish_directory(store, source)
    assert publish_directory(store, source) == uri  # content-addressed: same files, same URI
    copy = materialize(store, uri, tmp_path / "cache", "ckpt-id")
    assert copy == tmp_path / "cache" / manifest_digest_of(uri) / "ckpt-id"
    assert (copy / "nested" / "weights.bin").read_bytes() == (
        source / "nested" / "weights.bin").read_bytes()
    assert materialize(store, uri, tmp_path / "cache", "ckpt-id") == copy  # fetched once

    # A corrupted file in the store fails the fetch and leaves no partial copy.
    manifest = json.loads(store.get_bytes(manifest_digest_of(uri)))
    store.path_of(manifest["files"]["config.json"]).write_text('{"a": 2}')
    with pytest.raises(ArtifactCorrupted):
        materialize(store, uri, tmp_path / "other-cache")
    assert list((tmp_path / "other-cache").rglob("*")) == [
        tmp_path / "other-cache" / manifest_digest_of(uri)]  # no partial copy
    with pytest.raises(ValueError, match="not a directory name"):
        materialize(store, uri, tmp_path / "cache", "../up")


def test_a_manifest_cannot_write_outside_the_cache(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    file_digest = store.put_bytes(b"x")
    manifest = json.dumps({"kind": "triloop.directory/v1",
                           "files": {"../escaped": file_digest}}, sort_keys=True).encode()
    uri = f"artifact://sha256/{store.put_bytes(manifest)}"
    with pytest.raises(ValueError, match="leaves the directory"):
        materialize(store, uri, tmp_path / "cache")
    assert not (tmp_path / "escaped").exists()


def test_checkpoint_dir_reads_artifact_uris_only_with_a_store(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    uri = publish_directory(store, _tree(tmp_path / "ckpt"))
    with pytest.raises(UnsupportedArtifactUri, match="TRILOOP_ARTIFACT_URL"):
        checkpoint_dir(uri, home=tmp_path)
    local = checkpoint_dir(uri, home=tmp_path, store=store, checkpoint_id="c" * 64)
    assert local == tmp_path / "artifact-cache" / manifest_digest_of(uri) / ("c" * 64)
    assert (local / "config.json").is_file()


def test_the_shared_store_is_opened_from_settings(tmp_path: Path) -> None:
    from triloop.artifact_backends import open_shared_store

    assert open_shared_store(Settings(home=tmp_path)) is None
    local = open_shared_store(Settings(home=tmp_path, artifact_url=f"file://{tmp_path}/shared"))
    assert isinstance(local, LocalArtifactStore) and local.root == tmp_path / "shared"
    with pytest.raises(ValueError, match="TRILOOP_ARTIFACT_S3_ENDPOINT"):
        open_shared_store(Settings(home=tmp_path, artifact_url="s3://bucket/ckpts"))
    s3 = open_shared_store(Settings(
        home=tmp_path, artifact_url="s3://bucket/ckpts", artifact_s3_endpoint="http://s3:9000",
        artifact_s3_access_key_id="id", artifact_s3_secret_access_key="secret"))
    assert isinstance(s3, S3ArtifactStore) and s3.location == "s3://bucket/ckpts"
    assert s3._url("a" * 64) == f"http://s3:9000/bucket/ckpts/{blob_key('a' * 64)}"


def test_sigv4_matches_the_published_s3_example() -> None:
    """AWS's documented example: GET /test.txt with a Range header (Signature Version 4)."""
    headers = sign_v4(
        method="GET", url="https://examplebucket.s3.amazonaws.com/test.txt",
        headers={"Range": "bytes=0-9"},
        payload_sha256="e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        credentials=S3Credentials("AKIAIOSFODNN7EXAMPLE",
                                  "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "us-east-1"),
        now=dt.datetime(2013, 5, 24, tzinfo=dt.UTC))
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


def test_the_learner_reads_a_parent_from_the_shared_store(tmp_path: Path) -> None:
    """The one URI boundary (both loops): artifact:// parents come through the store's cache;
    relative paths are relative to home."""
    from triloop.weights import UnsupportedArtifactUri, checkpoint_dir

    store = LocalArtifactStore(tmp_path / "store")
    uri = publish_directory(store, _tree(tmp_path / "ckpt"))
    with pytest.raises(UnsupportedArtifactUri, match="TRILOOP_ARTIFACT_URL"):
        checkpoint_dir(uri, home=tmp_path)
    parent = checkpoint_dir(uri, home=tmp_path, store=store, cache=tmp_path / "cache",
                            checkpoint_id="p" * 64)
    assert parent.name == "p" * 64  # the learner checks a checkpoint's directory name
    assert parent.is_relative_to(tmp_path / "cache")
    assert (parent / "nested" / "weights.bin").is_file()
    assert checkpoint_dir((tmp_path / "ckpt").as_uri(), home=tmp_path) == tmp_path / "ckpt"
    assert checkpoint_dir("ckpt", home=tmp_path) == tmp_path / "ckpt"
