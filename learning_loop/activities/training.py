"""One iteration of learning as plain functions: load parent -> GRPO update -> monitors -> save.

No Temporal and no database here: ``learning_loop.activities.update`` wraps these with
heartbeats, idempotency and the writes, and a test or benchmark can call them directly.

A checkpoint directory holds the weights (safetensors) plus the files that make it a
servable Hugging Face model (config, generation config, tokenizer), copied from its
parent so every checkpoint in a lineage loads the same way, and ``trainer_state.pt``
(optimizer, scheduler, RNG, data cursor) from ``learning_loop.checkpoints``.
"""

from __future__ import annotations

import math
import os
import random
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from learning_loop.batch import build_training_samples
from learning_loop.checkpoints import (
    CheckpointError,
    CheckpointRef,
    load_checkpoint,
    save_checkpoint,
)
from learning_loop.objective import score_cross_input
from learning_loop.stability import (
    Alarm,
    DiscriminationResult,
    IterationMetrics,
    detect_echo_trap,
    detect_template_collapse,
    distinct_prompt_pairs,
    iteration_metrics,
    retrieval_accuracy,
)
from learning_loop.trajectory_reader import RolloutData
from learning_loop.update import UpdateMetrics, UpdateSettings, build_optimizer, select_device
from learning_loop.update import update_policy as grpo_update
from triloop.run_config import RunConfig

# Files a checkpoint directory carries besides its weights and trainer state.
_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")
_TRAINER_FILES = ("trainer_state.pt",)


class NoTrainableData(ValueError):
    """The rollout batches hold no finished trajectory to learn from."""


@dataclass
class IterationOutcome:
    """What an iteration produced: the checkpoint, the ``training_step`` columns, alarms."""

    checkpoint: CheckpointRef
    weights_changed: bool
    step_columns: dict[str, Any]
    stability: IterationMetrics
    alarms: list[Alarm] = field(default_factory=list)


class ServableModel:
    """A model whose ``save_pretrained`` also writes its parent's config and tokenizer files."""

    def __init__(self, model: PreTrainedModel, source_dir: Path) -> None:
        self.model = model
        self.source_dir = source_dir

    def save_pretrained(self, save_directory: str | os.PathLike[str]) -> None:
        """Weights from the model, everything else as in the source directory."""
        target = Path(save_directory)
        self.model.save_pretrained(target)
        for item in sorted(self.source_dir.iterdir()):
            if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and (
                item.name not in _TRAINER_FILES
            ):
                shutil.copyfile(item, target / item.name)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped model's state."""
        return dict(self.model.state_dict())

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Load into the wrapped model."""
        return self.model.load_state_dict(state_dict, strict=strict)


def load_model(model_dir: Path, device: torch.device) -> PreTrainedModel:
    """A Hugging Face causal LM from a local directory, in float32 on ``device``.

    Built from its config and filled from the safetensors files rather than with
    ``from_pretrained``: that one initialises on the meta device through process-global
    state, so two threads loading at once (a test's in-process execution worker beside
    this learner) can get each other's meta tensors.
    """
    config = AutoConfig.from_pretrained(model_dir)
    with torch.random.fork_rng(devices=[]):  # the random init must not move the run's RNG
        model: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.float32)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    current = model.state_dict()
    loaded = {current[name].data_ptr() for name in tensors if name in current}
    untied = [name for name in missing if current[name].data_ptr() not in loaded]
    if unexpected or untied or not tensors:
        raise CheckpointError(
            f"{model_dir} does not fit its config: unexpected {sorted(unexpected)[:5]},"
            f" missing {sorted(untied)[:5]}, {len(tensors)} tensors"
        )
    cast(torch.nn.Module, model).to(device)  # in place; the cast sidesteps HF's decorator type
    return model


def save_servable(
    artifact_dir: Path, model: PreTrainedModel, source_dir: Path, **kwargs: Any
) -> CheckpointRef:
    """``save_checkpoint`` for a model whose other files come from ``source_dir``."""
    return save_checkpoint(artifact_dir, ServableModel(model, source_dir), **kwargs)


def discrimination(
    model: torch.nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    config: RunConfig, device: torch.device,
) -> DiscriminationResult | None:
    """Cross-input retrieval accuracy over distinct prompts, or None with fewer than two."""
    prompts, responses = distinct_prompt_pairs(pairs, config.stability.discrimination_prompts)
    if len(prompts) < 2:
        return None
    return retrieval_accuracy(score_cross_input(model, prompts, responses, device=device))


def train_iteration(
    *,
    artifact_dir: Path,
    parent_dir: Path,
    resume_optimizer: bool,
    reference_dir: Path | None,
    config: RunConfig,
    data: RolloutData,
    iteration: int,
    history: Sequence[IterationMetrics],
    data_cursor: Mapping[str, Any],
    on_stage: Callable[[str], None] = lambda _stage: None,
) -> IterationOutcome:
    """Update the parent checkpoint (policy version ``iteration - 1``) on ``data``; save."""
    if not data.returns:
        raise NoTrainableData(
            f"iteration {iteration} has no finished trajectory to learn from"
            f" ({data.skipped} failed or never started); check the execution loop's episodes"
        )
    device = select_device()
    on_stage("loading")
    model = load_model(parent_dir, device)
    optimizer, scheduler = build_optimizer(model, config.optimizer)
    if resume_optimizer:
        load_checkpoint(parent_dir, model, optimizer, scheduler)
    else:  # a new run from a base: fresh optimizer, RNG from the run's seed
        load_checkpoint(parent_dir, model, restore_rng=False)
        random.seed(config.schedule.seed)
        torch.manual_seed(config.schedule.seed)
    parent_id = parent_dir.name
    samples, advantages = build_training_samples(data.steps, config.advantage)
    on_stage("scoring")
    found = discrimination(
        model, [(s.prompt_token_ids, s.action_token_ids) for s in samples], config, device
    )
    reference = None
    if reference_dir is not None and config.objective.kl_coef > 0:
        reference = load_model(reference_dir, device)
        reference.train(False)
    on_stage("updating")
    pad = model.config.pad_token_id
    update = grpo_update(
        model, optimizer, samples, UpdateSettings.from_run(config), policy_version=iteration - 1,
        reference=reference, scheduler=scheduler, device=device,
        pad_token_id=pad if isinstance(pad, int) else 0,
    ) if samples else None
    stability = iteration_metrics(
        iteration=iteration, returns=data.returns, trajectory_lengths=data.lengths,
        token_entropy=update.entropy if update else 0.0,
        grad_norm=update.grad_norm if update else None,
        kl=update.reference_kl if update else None, discrimination=found,
    )
    alarms = [a for a in (
        detect_echo_trap([*history, stability], config.stability),
        detect_template_collapse(stability, config.stability, history=history),
    ) if a is not None]
    columns = step_columns(stability, update, alarms, advantages.zero_variance_groups,
                           advantages.groups, data)
    on_stage("saving")
    ref = save_servable(
        artifact_dir, model, parent_dir, optimizer=optimizer, scheduler=scheduler,
        data_cursor=data_cursor,
        metadata={"iteration": iteration, "training_step": columns,
                  "alarms": [alarm_record(a) for a in alarms]},
    )
    return IterationOutcome(ref, ref.id != parent_id, columns, stability, alarms)


def alarm_record(alarm: Alarm) -> dict[str, Any]:
    """An alarm as plain, JSON-safe data (stored with the checkpoint and audited)."""
    record: dict[str, Any] = finite({"kind": alarm.kind, "iteration": alarm.iteration,
                                     "message": alarm.message, "evidence": dict(alarm.evidence)})
    return record


def step_columns(
    stability: IterationMetrics, update: UpdateMetrics | None, alarms: Sequence[Alarm],
    zero_variance_groups: int, groups: int, data: RolloutData,
) -> dict[str, Any]:
    """The ``training_step`` columns of an iteration (JSON-safe: no NaN or infinity)."""
    columns: dict[str, Any] = finite({
        "loss": update.loss if update else None,
        "kl": stability.kl,
        "entropy": stability.token_entropy if update else None,
        "reward_mean": stability.reward_mean,
        "reward_variance": stability.reward_variance,
        "within_group_reward_variance": stability.within_group_reward_variance,
        "grad_norm": stability.grad_norm,
        "discrimination": stability.retrieval_accuracy,
        "trainable_tokens": update.trainable_tokens if update else 0,
        "length_stats": {"p50": stability.length_p50, "p90": stability.length_p90,
                         "max": stability.length_max},
        "metrics": {
            "stability": stability.as_dict(),
            "update": update.as_dict() if update else None,
            "batch": {"trajectories": len(data.returns), "skipped": data.skipped,
                      "groups": groups, "zero_variance_groups": zero_variance_groups,
                      "policy_versions": sorted(set(data.policy_versions))},
            "alarm_messages": [a.message for a in alarms],
        },
        "alarms": [a.kind for a in alarms],
    })
    return columns


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSONB has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def stability_history(rows: Sequence[Mapping[str, Any]]) -> list[IterationMetrics]:
    """Earlier iterations' monitors from their stored ``training_step.metrics``."""
    history = []
    for metrics in rows:
        stored = metrics.get("stability")
        if isinstance(stored, dict):
            history.append(IterationMetrics(**stored))
    return history


def saved_iteration(checkpoint_dir: Path, *, run_id: str, iteration: int) -> dict[str, Any] | None:
    """The iteration record a checkpoint was saved with, if it is this run's ``iteration``."""
    state_file = checkpoint_dir / "trainer_state.pt"
    if not state_file.is_file():
        return None
    state = torch.load(state_file, map_location="cpu", weights_only=True)
    metadata = state.get("metadata") or {}
    cursor = state.get("data_cursor") or {}
    if metadata.get("iteration") != iteration or cursor.get("run_id") != run_id:
        return None
    return dict(metadata)
