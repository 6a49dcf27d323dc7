"""Retention's file side: what a pruned checkpoint loses, and what it never touches."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from learning_loop.retention import CheckpointFiles
from learning_loop.store import PrunedCheckpoint
from triloop.artifacts import LocalArtifactStore, manifest_digest_of, materialize, publish_directory
from triloop.retention import DEFAULT_KEEP_LAST, RetentionPolicy
from triloop.run_config import RunConfig


def checkpoint_dir(root: Path, name: str, weights: bytes) -> Path:
    folder = root / "checkpoints" / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "trainer_state.pt").write_bytes(weights[::-1])
    (folder / "tokenizer.json").write_text("{}")  # the same in every checkpoint of a lineage
    return folder


def pruned(checkpoint_id: str, uri: str) -> PrunedCheckpoint:
    return PrunedCheckpoint(checkpoint_id, uri, 1, datetime.now(UTC), "keep_last=1 of run r",
                            True)


def test_shared_store_loses_only_the_pruned_checkpoints_own_bulky_blobs(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "shared")
    artifacts, cache = tmp_path / "artifacts", tmp_path / "cache"
    old = checkpoint_dir(artifacts, "old", b"old weights")
    kept = checkpoint_dir(artifacts, "kept", b"kept weights")
    (kept / "frozen.safetensors").write_bytes(b"a shard both share")
    (old / "frozen.safetensors").write_bytes(b"a shard both share")
    old_uri, kept_uri = publish_directory(store, old), publish_directory(store, kept)
    materialize(store, old_uri, cache, "old")
    manifest = manifest_digest_of(old_uri)

    freed = CheckpointFiles(artifact_dir=artifacts, store=store, cache_dir=cache).delete(
        [pruned("old", old_uri)], kept_uris=[kept_uri])

    assert freed > 0 and not old.exists() and not (cache / manifest).exists() and kept.is_dir()
    names = {"model.safetensors": b"old weights", "trainer_state.pt": b"old weights"[::-1]}
    import hashlib

    for name, data in names.items():
        assert not store.exists(hashlib.sha256(data).hexdigest()), name
    for data in (b"kept weights", b"a shard both share", b"{}"):
        assert store.exists(hashlib.sha256(data).hexdigest())
    assert store.exists(manifest)  # the manifest stays: it lists what the checkpoint held


def test_a_directory_outside_the_artifact_store_is_never_deleted(tmp_path: Path) -> None:
    elsewhere = checkpoint_dir(tmp_path / "people", "base", b"a person's model")
    files = CheckpointFiles(artifact_dir=tmp_path / "artifacts")
    assert files.delete([pruned("base", elsewhere.as_uri())]) == 0
    assert (elsewhere / "model.safetensors").is_file()


def test_retention_policy_and_run_config() -> None:
    config = RunConfig.model_validate({"name": "r", "model": {"base": "b"},
                                       "rollout": {"task_ids": ["t"]}})
    assert config.checkpoints.keep_last is None
    stack = RetentionPolicy(enabled=True, keep_last=DEFAULT_KEEP_LAST)
    assert stack.keep_for(config.checkpoints.keep_last) == 3
    assert stack.keep_for(7) == 7
    assert RetentionPolicy(enabled=False, keep_last=3).keep_for(7) is None
