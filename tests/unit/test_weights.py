"""The kernel's weights digest matches the learning loop's checkpoint id byte for byte."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from learning_loop.checkpoints import saved_weights_digest
from triloop.weights import (
    UnsupportedArtifactUri,
    WeightsIntegrityError,
    checkpoint_dir,
    safetensors_digest,
    verify_weights,
)


def test_tiny_model_digest_is_its_checkpoint_id(tiny_model_dir: Path) -> None:
    assert safetensors_digest(tiny_model_dir) == saved_weights_digest(tiny_model_dir)


def test_every_dtype_shape_and_split_files_hash_as_the_learning_loop(tmp_path: Path) -> None:
    torch.manual_seed(3)
    first = {
        "b.weight": torch.randn(3, 4, dtype=torch.bfloat16),
        "a.bias": torch.randn(5, dtype=torch.float16),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "mask": torch.tensor([True, False, True]),
    }
    second = {
        "c.ids": torch.arange(7, dtype=torch.int64).reshape(7, 1),
        "d.small": torch.tensor([-3, 4], dtype=torch.int8),
        "e.bytes": torch.tensor([1, 255], dtype=torch.uint8),
        "f.float": torch.randn(2, 2, 2),
    }
    save_file(first, str(tmp_path / "model-00001-of-00002.safetensors"),
              metadata={"format": "pt"})
    save_file(second, str(tmp_path / "model-00002-of-00002.safetensors"))
    assert safetensors_digest(tmp_path) == saved_weights_digest(tmp_path)


def test_a_swapped_file_is_refused_naming_the_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    checkpoint_id = safetensors_digest(copy)
    verify_weights(copy, checkpoint_id)  # the same weights pass
    save_file({"lm_head.weight": torch.ones(2, 2)}, str(copy / "model.safetensors"))
    with pytest.raises(WeightsIntegrityError) as refused:
        verify_weights(copy, checkpoint_id)
    assert checkpoint_id in str(refused.value) and "hash to" in str(refused.value)
    assert refused.value.checkpoint_id == checkpoint_id


@pytest.mark.parametrize("damage", ["missing", "truncated", "not_safetensors"])
def test_unreadable_weights_are_refused(tmp_path: Path, damage: str) -> None:
    weights = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(64)}, str(weights))
    if damage == "missing":
        weights.unlink()
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-10])
    else:
        weights.write_bytes(b"not a safetensors file at all")
    with pytest.raises(WeightsIntegrityError, match="cannot be read to verify"):
        verify_weights(tmp_path, "0" * 64)


def test_checkpoint_directories_from_artifact_uris(tmp_path: Path) -> None:
    assert checkpoint_dir((tmp_path / "m").as_uri(), home=Path("/h")) == tmp_path / "m"
    assert checkpoint_dir("artifacts/m", home=Path("/h")) == Path("/h/artifacts/m")
    with pytest.raises(UnsupportedArtifactUri):
        checkpoint_dir("s3://bucket/m", home=Path("/h"))
