"""Model sources for the import tests, made from the tiny model (and a GGUF from gguf's writer).

Nothing here downloads: each source is the tiny model saved another way, or a GGUF file
written by the ``gguf`` package with the metadata a test needs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

from learning_loop.tiny_model import create_tiny_model

SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "generation_config.json")


def tiny_source(target: Path, *, dtype: torch.dtype = torch.float32,
                max_shard_size: str | None = None, seed: int = 0) -> Path:
    """The tiny model as a Hugging Face directory, in ``dtype``, sharded when a size is given."""
    from transformers import AutoModelForCausalLM

    plain = create_tiny_model(target.with_name(target.name + "-plain"), seed=seed)
    if dtype == torch.float32 and max_shard_size is None:
        shutil.copytree(plain, target)
        return target
    model = AutoModelForCausalLM.from_pretrained(plain, dtype=dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(target, **kwargs)
    for name in SIDE_FILES:
        shutil.copyfile(plain / name, target / name)
    return target


def write_gguf(path: Path, *, architecture: str = "llama", chat_template: str | None = "{{x}}",
               tokenizer: bool = True) -> Path:
    """A tiny GGUF file with the given architecture string and tokenizer metadata."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    writer.add_name("tiny test model")
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
