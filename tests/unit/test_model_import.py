"""Reading and checking a model source before an import loads it (learning_loop.model_import).

Every refusal names the problem; none needs the weights loaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from learning_loop.model_import import (
    ModelImportError,
    example_path,
    inspect_source,
    load_for_import,
    parameter_count,
)
from learning_loop.tiny_model import create_tiny_model, tiny_model_info
from tests.factories_models import tiny_source, write_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _copy(tiny: Path, tmp_path: Path, *drop: str) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(tiny, target)
    for name in drop:
        (target / name).unlink()
    return target


def test_a_plain_directory_is_a_float32_huggingface_source(tiny: Path) -> None:
    source = inspect_source(tiny)
    assert (source.kind, source.source_dtype, source.architecture) == (
        "huggingface", "float32", "llama")


def test_bf16_and_sharded_directories_are_read_from_their_headers(tmp_path: Path) -> None:
    bf16 = inspect_source(tiny_source(tmp_path / "bf16", dtype=torch.bfloat16))
    assert bf16.source_dtype == "bfloat16"
    sharded = tiny_source(tmp_path / "sharded", max_shard_size="200KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    assert inspect_source(sharded).source_dtype == "float32"


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    sharded = tiny_source(tmp_path / "sharded", max_shard_size="200KB")
    first = sorted(sharded.glob("*.safetensors"))[0]
    first.unlink()
    with pytest.raises(ModelImportError, match=f"missing.*{first.name}"):
        inspect_source(sharded)


def test_a_directory_without_config_json_is_refused(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelImportError, match="has no config.json"):
        inspect_source(_copy(tiny, tmp_path, "config.json"))


def test_bin_weights_only_are_refused_with_the_way_out(tiny: Path, tmp_path: Path) -> None:
    source = _copy(tiny, tmp_path, "model.safetensors")
    (source / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelImportError, match=r"\.bin weights only.*save_pretrained"):
        inspect_source(source)


def test_a_tokenizer_without_a_chat_template_is_refused(tiny: Path, tmp_path: Path) -> None:
    source = _copy(tiny, tmp_path, "chat_template.jinja")
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelImportError, match="has no chat template"):
        inspect_source(source)


def test_no_tokenizer_is_refused(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelImportError, match="has no tokenizer"):
        inspect_source(_copy(tiny, tmp_path, "tokenizer.json"))


def test_a_model_type_without_a_causal_lm_is_refused(tiny: Path, tmp_path: Path) -> None:
    source = _copy(tiny, tmp_path)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "model_type": "resnet"}))
    with pytest.raises(ModelImportError, match="'resnet' is not a causal language model"):
        inspect_source(source)


def test_a_gguf_architecture_transformers_cannot_read_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "odd.gguf", architecture="tinyfrobnicator")
    with pytest.raises(ModelImportError, match="architecture 'tinyfrobnicator' is not one"):
        inspect_source(path)


def test_a_gguf_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelImportError, match="no chat template"):
        inspect_source(write_gguf(tmp_path / "plain.gguf", chat_template=None))
    with pytest.raises(ModelImportError, match="carries no tokenizer"):
        inspect_source(write_gguf(tmp_path / "bare.gguf", tokenizer=False))


def test_a_readable_gguf_passes_the_checks(tmp_path: Path) -> None:
    source = inspect_source(write_gguf(tmp_path / "ok.gguf"))
    assert (source.kind, source.architecture) == ("gguf", "llama")


def test_other_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(ModelImportError, match="does not exist"):
        inspect_source(tmp_path / "nowhere")
    (tmp_path / "weights.txt").write_text("x")
    with pytest.raises(ModelImportError, match="neither a Hugging Face model directory"):
        inspect_source(tmp_path / "weights.txt")


def test_the_example_model_is_found_in_its_package_and_an_unknown_one_named() -> None:
    path = example_path("smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert inspect_source(path).source_dtype == "q4_1"
    with pytest.raises(ModelImportError, match="no example model 'gpt5'"):
        example_path("gpt5")


def test_a_bf16_directory_loads_in_float32_with_its_side_files(tmp_path: Path) -> None:
    source = inspect_source(tiny_source(tmp_path / "bf16", dtype=torch.bfloat16))
    side = tmp_path / "side"
    side.mkdir()
    model = load_for_import(source, side)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert parameter_count(model) == tiny_model_info(tmp_path / "bf16-plain").num_parameters
    assert (side / "chat_template.jinja").is_file() and not (side / "config.json").exists()
