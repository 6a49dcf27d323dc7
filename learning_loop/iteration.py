"""One iteration of learning as plain functions: load parent -> GRPO update -> monitors -> save.

No Temporal and no database here: ``learning_loop.activities.update`` wraps these with
heartbeats, idempotency and the writes, and a test or benchmark can call them directly.

A checkpoint directory holds the weights (safetensors) plus the files that make it a
servable Hugging Face model (config, generation config, tokenizer), copied from its
parent so every checkpoint in a lineage loads the same way, and ``trainer_state.pt``
(optimizer, scheduler, RNG, data cursor) from ``learning_loop.checkpoints``.

With ``update.lora`` the learner is the run's base with peft adapters
(``learning_loop.lora``), and every checkpoint after the base is an adapter on it.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from learning_loop.batch import TrainingSample, build_training_samples, collate, without_groups
from learning_loop.batch_metrics import dynamic_sampling_series, merge_series, reward_series
from learning_loop.checkpoints import (
    CheckpointError,
    CheckpointRef,
    annotate_checkpoint,
    load_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    saved_weights_digest,
)
from learning_loop.iteration_records import alarm_record, step_columns
from learning_loop.lora import (
    AdapterDisabled,
    AdapterModel,
    LoraConfigError,
    check_adapter_fits,
    wrap_lora,
)
from learning_loop.objective import score_cross_input, token_entropy
from learning_loop.rank_launch import RankJob, run_ranks
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
from learning_loop.update import (
    UpdateSettings,
    build_optimizer,
    select_device,
    set_learning_rate,
)
from learning_loop.update import update_policy as grpo_update
from learning_loop.update_options import apply_update_options
from triloop.run_config import RunConfig
from triloop.weights import is_adapter_dir

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
    learner: WarmLearner | None = None  # the learner as it left the checkpoint, to go on


@dataclass
class WarmLearner:
    """A learner held in memory as it was saved: its checkpoint's id, the model, optimizer and
    scheduler, and the RNG state saved with them.

    The next update of the same run starts from exactly this state, so it need not read
    the checkpoint back from disk: loading it would give the same weights (the id is their
    hash), optimizer, scheduler and RNG.
    """

    checkpoint_id: str
    model: PreTrainedModel
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    rng: dict[str, Any]

    def resume(self, config: RunConfig
               ) -> tuple[PreTrainedModel, torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
        """What ``load_learner`` would return for this checkpoint, without reading it."""
        restore_rng_state(self.rng)
        self.optimizer.zero_grad(set_to_none=True)
        cast(torch.nn.Module, self.model).train(True)  # as a freshly built model is
        set_learning_rate(self.optimizer, self.scheduler, config.optimizer.learning_rate)
        return self.model, self.optimizer, self.scheduler


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
    if is_adapter_dir(model_dir):
        raise CheckpointError(
            f"{model_dir} is a LoRA adapter, not full weights: continue it with update.lora"
            " (its rank, alpha and target modules) on its base")
    config = AutoConfig.from_pretrained(model_dir)
    with torch.random.fork_rng(devices=[]):  # the random init must not move the run's RNG
        model: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.float32)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    _tie_output_embeddings(model)
    current = model.state_dict()
    loaded = {current[name].data_ptr() for name in tensors if name in current}
    untied = [name for name in missing if current[name].data_ptr() not in loaded]
    if unexpected or untied or not tensors:
        raise CheckpointError(
            f"{model_dir} does not fit its config: unexpected {sorted(unexpected)[:5]},"
            f" missing {sorted(untied)[:5]}, {len(tensors)} tensors"
        )
    if any(p.is_meta for p in model.parameters()):  # transient: retried by the activity
        raise RuntimeError(f"{model_dir}: model built with meta tensors; try again")
    cast(torch.nn.Module, model).to(device)  # in place; the cast sidesteps HF's decorator type
    return model


def _tie_output_embeddings(model: PreTrainedModel) -> None:
    """Share the input embeddings with the output layer when the config ties them.

    Done by hand: ``tie_weights`` may be switched off process-wide while another thread
    is inside ``from_pretrained``.
    """
    output: torch.nn.Module | None = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    shared: torch.nn.Parameter = model.get_input_embeddings().weight  # type: ignore[assignment]
    weight = getattr(output, "weight", None)
    if getattr(model.config, "tie_word_embeddings", False) and isinstance(weight, torch.Tensor) \
            and weight.data_ptr() != shared.data_ptr():
        output.weight = shared  # type: ignore[union-attr]


def save_servable(
    artifact_dir: Path, model: PreTrainedModel, source_dir: Path, *,
    base: CheckpointRef | None = None, **kwargs: Any,
) -> CheckpointRef:
    """``save_checkpoint`` for a model whose other files come from ``source_dir``; with
    ``base``, the model is a LoRA learner saved as an adapter on it."""
    if base is not None:
        return save_checkpoint(artifact_dir, AdapterModel(cast(PeftModel, model), base.path),
                               **kwargs)
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
    parent: CheckpointRef,
    resume_optimizer: bool,
    reference_dir: Path | None,
    config: RunConfig,
    data: RolloutData,
    iteration: int,
    history: Sequence[IterationMetrics],
    data_cursor: Mapping[str, Any],
    on_stage: Callable[[str], None] = lambda _stage: None,
    series: Mapping[str, float] | None = None,
    warm: WarmLearner | None = None,
    base: CheckpointRef | None = None,
) -> IterationOutcome:
    """Update the parent checkpoint (policy version ``iteration - 1``) on ``data``; save.

    ``warm``, the learner an earlier update of the run left in memory, is used instead of
    loading the parent when it is the parent's and the run resumes its optimizer.

    A batch without learning signal (no sample, or every advantage zero and neither a KL
    term nor an entropy bonus) changes nothing: no optimizer step, no new checkpoint; the
    outcome names the parent.

    With ``update.lora``, ``base`` is the run's base checkpoint: the frozen model the
    adapters sit on, whose id every adapter checkpoint's id includes.
    """
    if not data.returns:
        raise NoTrainableData(
            f"iteration {iteration} has no finished trajectory to learn from"
            f" ({data.skipped} failed or never started, {data.truncated_excluded} truncated"
            " episodes left out by asynchrony.truncated_episodes); check the execution loop's"
            " episodes, or raise rollout.deadline_s"
        )
    device = select_device()
    on_stage("loading")
    if warm is not None and resume_optimizer and warm.checkpoint_id == parent.id \
            and config.update.world_size == 1:
        model, optimizer, scheduler = warm.resume(config)
    else:
        warm = None
        model, optimizer, scheduler = load_learner(parent.path, config, device,
                                                   resume_optimizer=resume_optimizer, base=base)
    all_samples, advantages = build_training_samples(data.steps, config.advantage)
    # The monitors look at everything sampled; the loss only at what dynamic sampling keeps.
    samples, sampling = all_samples, {}
    if config.sampling.dynamic_sampling:
        samples = without_groups(all_samples, advantages.zero_variance_group_ids)
        sampling = dynamic_sampling_series(advantages.zero_variance_groups, advantages.groups)
    on_stage("scoring")
    found = discrimination(
        model, [(s.prompt_token_ids, s.action_token_ids) for s in all_samples], config, device
    )
    signal = any(s.advantage != 0.0 for s in samples) or (
        bool(samples) and (config.objective.kl_coef > 0 or config.objective.entropy_coef > 0))
    update, saved = None, None
    if signal:
        on_stage("updating")
        pad = model.config.pad_token_id
        pad_token_id = pad if isinstance(pad, int) else 0
        if config.update.world_size > 1:
            cast(torch.nn.Module, model).to("cpu")  # the ranks own the accelerators now
            outcome = run_ranks(RankJob(
                artifact_dir=artifact_dir, parent_dir=parent.path, reference_dir=reference_dir
                if config.objective.kl_coef > 0 else None, resume_optimizer=resume_optimizer,
                config=config, samples=samples, policy_version=iteration - 1,
                pad_token_id=pad_token_id, data_cursor=data_cursor))
            update, saved = outcome.metrics, outcome.checkpoint
        else:
            reference: torch.nn.Module | None = None
            if config.update.lora is not None and config.objective.kl_coef > 0:
                reference = AdapterDisabled(cast(PeftModel, model))  # the base, not a copy
            elif reference_dir is not None and config.objective.kl_coef > 0:
                reference = load_model(reference_dir, device)
                reference.train(False)
            apply_update_options(config.update, device, model, reference)
            update = grpo_update(
                model, optimizer, samples, UpdateSettings.from_run(config),
                policy_version=iteration - 1, reference=reference, scheduler=scheduler,
                device=device, pad_token_id=pad_token_id,
            )
    stability = iteration_metrics(
        iteration=iteration, returns=data.returns, trajectory_lengths=data.lengths,
        token_entropy=update.entropy if update else action_entropy(model, all_samples, device),
        grad_norm=update.grad_norm if update else None,
        kl=update.reference_kl if update else None, discrimination=found,
    )
    alarms = [a for a in (
        detect_echo_trap([*history, stability], config.stability),
        detect_template_collapse(stability, config.stability, history=history),
    ) if a is not None]
    columns = step_columns(stability, update, alarms, advantages.zero_variance_groups,
                           advantages.groups, data,
                           series=merge_series(series, reward_series(data.returns), sampling))
    if update is None:  # nothing moved: a learner reused from memory is still the parent's
        return IterationOutcome(parent, False, columns, stability, alarms, learner=warm)
    on_stage("saving")
    metadata = {"iteration": iteration, "training_step": columns,
                "alarms": [alarm_record(a) for a in alarms]}
    if saved is not None:  # rank 0 saved the weights and trainer state; add the records
        ref = annotate_checkpoint(saved, metadata)
    else:
        ref = save_servable(artifact_dir, model, parent.path, optimizer=optimizer,
                            scheduler=scheduler, data_cursor=data_cursor, metadata=metadata,
                            base=base if config.update.lora is not None else None)
        # The RNG as saved: nothing random ran since the trainer state captured it.
        learner = WarmLearner(ref.id, model, optimizer, scheduler, rng_state())
        return IterationOutcome(ref, ref.id != parent.id, columns, stability, alarms,
                                learner=learner)
    return IterationOutcome(ref, ref.id != parent.id, columns, stability, alarms)


def load_learner(
    parent_dir: Path, config: RunConfig, device: torch.device, *, resume_optimizer: bool,
    base: CheckpointRef | None = None,
) -> tuple[PreTrainedModel, torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """The parent's model with its optimizer and scheduler, at the run's learning rate.

    Resuming a run restores the optimizer, scheduler and RNG the parent was saved with; a
    new run from a base starts a fresh optimizer and seeds the RNG from the run's seed.
    With ``update.lora`` the model is ``base`` with the parent's adapter (fresh adapters
    when the parent is the base) and the optimizer holds only the adapter's parameters.
    """
    saved: AdapterModel | PreTrainedModel | None
    if config.update.lora is not None:
        model, saved = lora_learner(parent_dir, config, device, base=base)
    else:
        model = saved = load_model(parent_dir, device)
    optimizer, scheduler = build_optimizer(model, config.optimizer)
    if resume_optimizer and saved is not None:
        load_checkpoint(parent_dir, saved, optimizer, scheduler)
    else:  # a new run (or fresh adapters on the base): nothing of theirs to resume
        if saved is not None:
            load_checkpoint(parent_dir, saved, restore_rng=False)
        random.seed(config.schedule.seed)
        torch.manual_seed(config.schedule.seed)
    set_learning_rate(optimizer, scheduler, config.optimizer.learning_rate)
    return model, optimizer, scheduler


def lora_learner(
    parent_dir: Path, config: RunConfig, device: torch.device, *, base: CheckpointRef | None,
) -> tuple[PreTrainedModel, AdapterModel | None]:
    """The run's base with fresh adapters (drawn from the run's seed), and, when the parent
    is an adapter, the view its checkpoint loads into (None: the parent is the base)."""
    lora = config.update.lora
    assert lora is not None
    if base is None:
        raise LoraConfigError("update.lora needs the run's base checkpoint to put adapters on")
    if not is_adapter_dir(parent_dir) and parent_dir.resolve() != base.path.resolve() and (
            saved_weights_digest(parent_dir) != base.id):
        raise LoraConfigError(
            f"parent checkpoint {parent_dir.name} holds full weights that are not the run's base"
            f" {base.id}; a LoRA run trains adapters on its base, so name that base")
    if saved_weights_digest(base.path) != base.id:
        raise CheckpointError(f"base {base.path} does not hash to its id {base.id}")
    model = load_model(base.path, device)
    learner = wrap_lora(model, lora, base_id=base.id, seed=config.schedule.seed)
    if is_adapter_dir(parent_dir):
        check_adapter_fits(parent_dir, lora, base.id)
        return cast(PreTrainedModel, learner), AdapterModel(learner, base.path)
    return cast(PreTrainedModel, learner), None


@torch.no_grad()
def action_entropy(
    model: torch.nn.Module, samples: Sequence[TrainingSample], device: torch.device
) -> float:
    """Mean policy entropy (nats) over the samples' action tokens, without training."""
    total, count = 0.0, 0.0
    for start in range(0, len(samples), 16):
        batch = collate(samples[start : start + 16]).to(device)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        total += float((token_entropy(logits) * batch.action_mask).sum())
        count += float(batch.action_mask.sum())
    return total / count if count else 0.0
