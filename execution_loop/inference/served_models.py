"""The checkpoints triloop's model server holds, each named and hashed.

The server starts with one model (``--model``, served as ``--served-model-name``) and loads
more at run time (``POST /v1/load_lora_adapter``), or replaces the start-up model's weights
in place (dev mode's ``reload_weights``, ``dev_mode.py``). Each entry records the sha256 of the
weights it actually loaded (``triloop.weights.checkpoint_digest``, the checkpoint id), and
``/v1/models`` reports it as ``weights_sha256``: a client can see that the name it asks for
is the weights it wants. A load under a name that is a sha256 (a checkpoint id) is refused
unless the directory's weights hash to it, so this server never holds one id with another
checkpoint's weights; a name given at start-up is reported as is, with the weights' hash
beside it, so a misconfigured server is visible rather than trusted.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from execution_loop.inference.torch_backend import TorchPolicyClient
from triloop.weights import checkpoint_digest

CHECKPOINT_ID = re.compile(r"^[0-9a-f]{64}$")


class LoadRefused(ValueError):
    """A load or unload the server will not do; the message says why."""


@dataclass(frozen=True)
class ServedModel:
    """One checkpoint the server answers for."""

    name: str
    client: TorchPolicyClient
    weights_sha256: str | None  # None: the directory has no safetensors weights to hash
    loaded_at: int  # unix seconds

    def card(self, parent: str | None) -> dict[str, Any]:
        """The ``/v1/models`` entry, in vLLM's shape plus ``weights_sha256``."""
        return {
            "id": self.name,
            "object": "model",
            "created": self.loaded_at,
            "owned_by": "triloop",
            "root": str(self.client.model_dir),
            "parent": parent,
            "max_model_len": self.client.max_model_len,
            "weights_sha256": self.weights_sha256,
        }


def _digest(model_dir: Path) -> str | None:
    try:
        return checkpoint_digest(model_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ServedModels:
    """Thread-safe registry: the start-up model plus up to ``max_loaded`` loaded at run time."""

    def __init__(
        self, base: TorchPolicyClient, base_name: str, *, device: str | None,
        max_loaded: int = 4,
    ) -> None:
        if max_loaded < 1:
            raise ValueError(f"max_loaded must be at least 1, got {max_loaded}")
        self.default_name = base_name
        self._device = device
        self._max_loaded = max_loaded
        self._base = ServedModel(base_name, base, _digest(base.model_dir), int(time.time()))
        self._loaded: OrderedDict[str, ServedModel] = OrderedDict()
        self._lock = threading.Lock()

    def default(self) -> ServedModel:
        """The start-up model (the one a full-weight reload replaces)."""
        return self._base

    def reload_default(self, model_dir: Path) -> ServedModel:
        """Replace the start-up model's weights with ``model_dir``'s, keeping its name.

        The caller pauses the server first (vLLM's reload_weights is done in place); the
        new entry's ``weights_sha256`` is the digest of what was actually loaded.
        """
        if not (model_dir / "config.json").is_file():
            raise LoadRefused(f"{model_dir} is not a checkpoint directory (no config.json)")
        old = self._base
        client = TorchPolicyClient(model_dir, device=self._device, checkpoint_id=old.name)
        self._base = ServedModel(old.name, client, _digest(model_dir), int(time.time()))
        old.client.close()
        return self._base

    def get(self, name: str) -> ServedModel | None:
        """The model served under ``name``, if any."""
        base = self._base
        if name == base.name:
            return base
        with self._lock:
            served = self._loaded.get(name)
            if served is not None:
                self._loaded.move_to_end(name)
            return served

    def cards(self) -> list[dict[str, Any]]:
        """Every served model's card, the start-up model first."""
        with self._lock:
            loaded = list(self._loaded.values())
        return [self._base.card(None), *(m.card(self._base.name) for m in loaded)]

    def load(self, name: str, model_dir: Path) -> ServedModel:
        """Load ``model_dir`` under ``name``; refuses a name taken or a hash that disagrees."""
        if not name:
            raise LoadRefused("lora_name must not be empty")
        if self.get(name) is not None:
            raise LoadRefused(f"The lora adapter '{name}' has already been loaded.")
        if not (model_dir / "config.json").is_file():
            raise LoadRefused(f"{model_dir} is not a checkpoint directory (no config.json)")
        digest = _digest(model_dir)
        if CHECKPOINT_ID.match(name) and digest != name:
            raise LoadRefused(
                f"refusing to serve {model_dir} as '{name}': its weights hash to {digest}")
        client = TorchPolicyClient(model_dir, device=self._device, checkpoint_id=name)
        served = ServedModel(name, client, digest, int(time.time()))
        evicted: list[ServedModel] = []
        with self._lock:
            if name in self._loaded:  # a concurrent load of the same name won
                client.close()
                return self._loaded[name]
            self._loaded[name] = served
            while len(self._loaded) > self._max_loaded:
                evicted.append(self._loaded.popitem(last=False)[1])
        for old in evicted:
            old.client.close()
        return served

    def unload(self, name: str) -> None:
        """Stop serving ``name`` (the start-up model cannot be unloaded)."""
        with self._lock:
            served = self._loaded.pop(name, None)
        if served is None:
            raise LoadRefused(f"The lora adapter '{name}' cannot be found.")
        served.client.close()
