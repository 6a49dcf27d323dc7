"""The shared artifact store in a real S3-compatible server (gofakes3, built by bootstrap with
go install): workers on other machines read checkpoints by id, every read verified."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text

from execution_loop.serving import PolicyCache
from learning_loop.tiny_model import create_tiny_model
from tests.factories_execution import register_checkpoint_dir
from triloop.artifacts import (
    ArtifactCorrupted,
    ArtifactNotFound,
    manifest_digest_of,
    publish_directory,
)
from triloop.config import ServiceName
from triloop.devstack.processes import free_port
from triloop.s3_store import S3ArtifactStore, S3Credentials
from triloop.weights import WeightsIntegrityError, safetensors_digest

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = REPO / ".triloop" / "bin" / "gofakes3"
    if not binary.exists():
        found = shutil.which("gofakes3")
        assert found, "gofakes3 is missing: run scripts/bootstrap.sh (it builds it with go install)"
        binary = Path(found)
    port = free_port()
    log = (tmp_path_factory.mktemp("s3") / "gofakes3.log").open("w")
    process = subprocess.Popen([str(binary), "-backend", "memory", "-initialbucket", "triloop",
                                "-host", f"127.0.0.1:{port}"], stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(endpoint, timeout=1)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, "gofakes3 did not start"
            time.sleep(0.1)
    yield endpoint
    process.terminate()
    process.wait(timeout=10)
    log.close()


@pytest.fixture
def store(s3_endpoint: str) -> Iterator[S3ArtifactStore]:
    store = S3ArtifactStore(endpoint=s3_endpoint, bucket="triloop", prefix="artifacts",
                            credentials=S3Credentials("test-key", "test-secret"))
    yield store
    store.close()


def _overwrite(store: S3ArtifactStore, digest: str, data: bytes) -> None:
    """Replace a stored object behind the store's back (as bit rot or an attacker would)."""
    response = store._send("PUT", store._url(digest), content=data,
                           payload_sha256=hashlib.sha256(data).hexdigest(),
                           headers={"content-length": str(len(data))})
    assert response.status_code == 200, response.text


def test_blobs_round_trip_through_the_bucket_and_corruption_is_refused(
    store: S3ArtifactStore, tmp_path: Path
) -> None:
    digest = store.put_bytes(b"weights")
    assert store.exists(digest) and store.put_bytes(b"weights") == digest
    assert store.get_bytes(digest) == b"weights"
    _overwrite(store, digest, b"weightz")
    with pytest.raises(ArtifactCorrupted, match=f"sha256 {digest} read from s3://triloop"):
        store.get_bytes(digest)
    with pytest.raises(ArtifactCorrupted):
        store.get_file(digest, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
    missing = "f" * 64
    assert not store.exists(missing)
    with pytest.raises(ArtifactNotFound):
        store.get_bytes(missing)


def test_another_machine_serves_a_checkpoint_by_id_from_the_bucket(
    store: S3ArtifactStore, owner_engine: Engine, role_engine: Callable[[ServiceName], Engine],
    tmp_path: Path,
) -> None:
    # A model of its own: a checkpoint id is its weights' digest, and the session's tiny model
    # is one row every other test reads from the local disk.
    tiny_model_dir = create_tiny_model(tmp_path / "model", seed=4343)
    checkpoint = safetensors_digest(tiny_model_dir)
    uri = publish_directory(store, tiny_model_dir)  # what a learner with the store records
    register_checkpoint_dir(owner_engine, tiny_model_dir)
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE checkpoint SET artifact_uri = :u WHERE id = :c"),
                     {"u": uri, "c": checkpoint})
    loaded: list[Path] = []

    def factory(checkpoint_id: str, model_dir: Path) -> object:
        loaded.append(model_dir)
        return type("Client", (), {"checkpoint_id": checkpoint_id})()

    worker_home = tmp_path / "other-machine"  # nothing of the learner's disk is here
    execution = role_engine("execution")
    cache = PolicyCache(engine=execution, factory=factory,  # type: ignore[arg-type]
                        home=worker_home, store=store)
    cache.get(checkpoint)
    assert loaded == [worker_home / "artifact-cache" / manifest_digest_of(uri) / checkpoint]
    assert safetensors_digest(loaded[0]) == checkpoint

    # A worker without a cached copy reading a tampered file refuses, and it is audited.
    manifest = store.get_bytes(manifest_digest_of(uri))
    weights_digest = json.loads(manifest)["files"]["model.safetensors"]
    _overwrite(store, weights_digest, b"not the weights")
    fresh = PolicyCache(engine=execution, factory=factory,  # type: ignore[arg-type]
                        home=tmp_path / "third-machine", store=store)
    with pytest.raises(WeightsIntegrityError, match="a stored file is corrupt"):
        fresh.get(checkpoint)
    with owner_engine.connect() as conn:
        during = conn.execute(text(
            "SELECT payload->>'during' FROM audit_event WHERE action = 'integrity_violation' "
            "AND resource->>'id' = :c ORDER BY seq DESC LIMIT 1"), {"c": checkpoint}).scalar_one()
    assert during == "reading from the artifact store"
