"""Precision and memory options of the policy update: bf16 autocast, activation checkpointing.

Both are applied to a loaded model, before the update, by wrapping forwards on the model
instance; no parameter, buffer or state-dict key changes, so the checkpoint saved after
the update is the same file layout and content id scheme as without them.

- ``bf16_autocast`` runs the model's forward under ``torch.autocast(bfloat16)``: matmuls
  in bf16, reductions and the weights (master copy) in fp32. The objective upcasts the
  logits before its log-softmax, so the loss and the optimizer stay fp32.
- ``gradient_checkpointing`` recomputes each decoder layer's activations during the
  backward pass instead of keeping them from the forward: memory of one layer instead of
  all of them, for about one more forward's compute. Hugging Face's own switch
  (``gradient_checkpointing_enable``) only acts in training mode, and the update runs in
  eval mode (no dropout, so the ratio compares the function the rollout sampled), so the
  layers are wrapped here with ``torch.utils.checkpoint`` (non-reentrant), whatever the mode.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer

from learning_loop.update import UpdateError
from triloop.run_config import UpdateConfig

# Keyword names under which Hugging Face layers receive the KV cache: the update never
# reads a cache, and a recomputed layer must not append to one a second time.
_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")
# Modules already wrapped, so applying an option twice wraps once.
_AUTOCAST: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
_CHECKPOINTED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


class UpdateOptionError(UpdateError):
    """An update option this device or model cannot honour; the message says why."""


def check_bf16(device: torch.device) -> None:
    """Refuse bf16 autocast where the device cannot run it.

    CUDA needs compute capability 8.0 (Ampere) or later for bf16 matmuls. CPU autocast to
    bf16 is always available in torch (native on AVX512-BF16/AMX, emulated elsewhere:
    correct but slower, as the learner bench shows).
    """
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "this GPU"
        raise UpdateOptionError(
            f"update.bf16_autocast is on but {name} has no bf16 support (needs compute"
            " capability 8.0 or later); set update.bf16_autocast to false"
        )
    if device.type not in ("cuda", "cpu"):
        raise UpdateOptionError(
            f"update.bf16_autocast supports cuda and cpu devices, not {device.type}"
        )


def enable_bf16_autocast(model: torch.nn.Module, device: torch.device) -> None:
    """Run ``model``'s forward under bf16 autocast from now on (idempotent)."""
    check_bf16(device)
    if model in _AUTOCAST:
        return
    inner: Callable[..., Any] = model.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return inner(*args, **kwargs)

    model.forward = forward
    _AUTOCAST.add(model)


def enable_activation_checkpointing(model: torch.nn.Module) -> int:
    """Recompute each decoder layer in the backward pass; returns how many layers."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise UpdateOptionError(
            f"update.gradient_checkpointing is on but {type(model).__name__} has no"
            " decoder layers triloop can checkpoint (transformers GradientCheckpointingLayer)"
        )
    for layer in layers:
        if layer in _CHECKPOINTED:
            continue
        layer.forward = functools.partial(_checkpointed, layer.forward)
        _CHECKPOINTED.add(layer)
    return len(layers)


def _checkpointed(inner: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():  # scoring without gradients: nothing to recompute
        return inner(*args, **kwargs)
    for name in _CACHE_KWARGS:
        if kwargs.get(name) is not None:
            kwargs[name] = None
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    # Non-reentrant: works with keyword inputs, DDP-style gradient hooks and no_grad parts.
    return checkpoint(functools.partial(inner, **kwargs), *args, use_reentrant=False)


def apply_update_options(
    config: UpdateConfig, device: torch.device, *models: torch.nn.Module | None
) -> None:
    """Apply the update's bf16 and checkpointing settings to the policy (and reference).

    The reference only runs forwards without gradients: it gets autocast, and no
    checkpointing (there is no backward to recompute for).
    """
    policy = models[0] if models else None
    if config.bf16_autocast:
        for model in models:
            if model is not None:
                enable_bf16_autocast(model, device)
    if config.gradient_checkpointing and policy is not None:
        enable_activation_checkpointing(policy)
