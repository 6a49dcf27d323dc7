"""LoRA updates with peft: low-rank adapters trained on a frozen base.

With ``update.lora`` each targeted linear layer ``W x`` computes
``W x + (alpha / r) B A x`` (Hu et al., 2021): ``A`` (r x in) and ``B`` (out x r) are the
only trainable parameters, so the optimizer holds only them; ``B`` starts at zero, so
the first policy is exactly the base. The GRPO objective is unchanged.

Where the objective has a KL term, its reference is the base: the same model with its
adapter switched off (``AdapterDisabled``), so no second copy of the base is loaded.

A checkpoint is then a peft adapter directory (``adapter_model.safetensors`` and
``adapter_config.json``, whose ``base_model_name_or_path`` is the base checkpoint's id)
plus the base's config, tokenizer and chat template, so it is served as base plus adapter
(the torch backend, or vLLM's runtime LoRA route). Its id is ``triloop.weights.
adapter_digest``: the adapter weights' digest and the base's id.

Departure from peft's defaults: the adapter's initial ``A`` is drawn under the run's seed
without moving the process RNG, so a run's first adapter is reproducible.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

from learning_loop.update import UpdateError
from triloop.run_config import LoraConfig
from triloop.weights import ADAPTER_CONFIG, adapter_base_id, adapter_config

ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Files of the base an adapter checkpoint does not copy: its weights, and trainer state.
_BASE_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin", ".pt")


class LoraConfigError(UpdateError):
    """``update.lora`` does not fit the model or the checkpoint; the message says how."""


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The names (last component) of the model's linear layers, which LoRA can target."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and name})


def check_targets(model: torch.nn.Module, config: LoraConfig) -> None:
    """Refuse target modules the model does not have, naming those it has."""
    have = linear_module_names(model)
    missing = [m for m in config.target_modules if m not in have]
    if missing:
        raise LoraConfigError(
            f"update.lora.target_modules names {missing}, which {type(model).__name__} does"
            f" not have; its linear layers are {have}")


def peft_config(config: LoraConfig) -> PeftLoraConfig:
    """The peft configuration of ``update.lora``."""
    return PeftLoraConfig(
        r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
        target_modules=list(config.target_modules), bias="none",
    )


def wrap_lora(model: torch.nn.Module, config: LoraConfig, *, base_id: str, seed: int
              ) -> PeftModel:
    """``model`` (the base, frozen) with fresh adapters; ``A`` drawn from ``seed``."""
    check_targets(model, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapped = get_peft_model(cast(Any, model), peft_config(config))
    # peft records the base's local path; the adapter names its base by checkpoint id.
    wrapped.peft_config["default"].base_model_name_or_path = base_id
    return cast(PeftModel, wrapped)


def check_adapter_fits(adapter_dir: Path, config: LoraConfig, base_id: str) -> None:
    """Refuse to continue an adapter of another base or with other settings than the run's."""
    saved = adapter_config(adapter_dir)
    found_base = adapter_base_id(adapter_dir)
    if found_base != base_id:
        raise LoraConfigError(
            f"checkpoint {adapter_dir.name} is an adapter on base {found_base}, not on the"
            f" run's base {base_id}; start the run from that base")
    wanted = {"r": config.rank, "lora_alpha": config.alpha,
              "target_modules": sorted(config.target_modules)}
    targets = saved.get("target_modules")
    found = {"r": saved.get("r"), "lora_alpha": saved.get("lora_alpha"),
             "target_modules": sorted(targets) if isinstance(targets, list) else targets}
    if found != wanted:
        raise LoraConfigError(
            f"checkpoint {adapter_dir.name} is an adapter with {found}, but update.lora asks"
            f" for {wanted}; continue it with its settings, or start a new adapter from the"
            " base")


class AdapterModel:
    """A peft model seen as a checkpoint: only its adapter is saved and loaded.

    ``save_pretrained`` writes peft's adapter directory plus the base's other files
    (config, tokenizer, chat template, generation config) from ``base_dir``, so the
    tokenizer and serving hashes read the same from either.
    """

    def __init__(self, model: PeftModel, base_dir: Path) -> None:
        self.model = model
        self.base_dir = base_dir

    def save_pretrained(self, save_directory: str | os.PathLike[str]) -> None:
        """Adapter weights and config from the model, everything else from the base."""
        target = Path(save_directory)
        self.model.save_pretrained(str(target), safe_serialization=True)
        (target / "README.md").unlink(missing_ok=True)  # peft's model card: a local path
        _canonical_adapter_config(target)
        for item in sorted(self.base_dir.iterdir()):
            if item.is_file() and not item.name.endswith(_BASE_WEIGHT_SUFFIXES) and (
                item.name not in (ADAPTER_CONFIG, "README.md")
            ):
                shutil.copyfile(item, target / item.name)

    def state_dict(self) -> dict[str, Any]:
        """The adapter's tensors, under the names peft saves them with."""
        return dict(get_peft_model_state_dict(self.model))

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Load adapter tensors; every adapter tensor must be there, and nothing else."""
        expected = set(self.state_dict())
        missing = sorted(expected - set(state_dict))
        unexpected = sorted(set(state_dict) - expected)
        if strict and (missing or unexpected):
            raise LoraConfigError(
                f"adapter weights do not fit the model: missing {missing[:5]},"
                f" unexpected {unexpected[:5]}")
        set_peft_model_state_dict(self.model, dict(state_dict))
        return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)


def _canonical_adapter_config(directory: Path) -> None:
    """Rewrite adapter_config.json with sorted lists and keys, so re-saves are identical."""
    path = directory / ADAPTER_CONFIG
    data = json.loads(path.read_text())
    if isinstance(data.get("target_modules"), list):
        data["target_modules"] = sorted(data["target_modules"])
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


class AdapterDisabled(torch.nn.Module):
    """The base as the KL reference: the policy's forward with its adapter switched off."""

    def __init__(self, policy: PeftModel) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The base model's output on the same inputs."""
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)


def adapter_record(checkpoint_dir: Path) -> dict[str, Any]:
    """What a checkpoint row's ``data`` says about an adapter checkpoint ({} for full weights):
    that it is a LoRA adapter, its base's id and its settings."""
    if not (checkpoint_dir / ADAPTER_CONFIG).is_file():
        return {}
    saved = adapter_config(checkpoint_dir)
    targets = saved.get("target_modules")
    return {"adapter": {
        "kind": "lora", "base_checkpoint_id": adapter_base_id(checkpoint_dir),
        "rank": saved.get("r"), "alpha": saved.get("lora_alpha"),
        "target_modules": sorted(targets) if isinstance(targets, list) else targets,
    }}
