"""One policy update: off-policy guard, micro-batched GRPO forward/backward, clip, step.

`update_policy` splits the samples of one rollout batch into `optimizer_steps_per_batch`
mini-batches (cut between trajectories); in each, a trajectory's turns are packed into one sequence
(`learning_loop.sequences`: one forward pass per trajectory, each action span with its
turn's advantage), and the sequences are cut into micro-batches (sorted by length to
limit padding) whose gradients accumulate, normalised by the mini-batch's totals so the result
is the gradient of the whole mini-batch. Then the global gradient norm is clipped
(pre-clip norm reported) and the optimizer steps, unless that norm is not finite, in
which case the step is skipped and counted.

With ``ranks`` (a multi-rank update, see ``learning_loop.data_parallel``) each rank
trains on its shard of every mini-batch and the gradients and statistics are summed
across ranks before the clip, so every rank takes the step one process would.

Dropout is off during the update (`model.eval()`): the ratio must compare the same
function the rollout sampled from. The one exception is a LoRA adapter's own dropout
(`update.lora.dropout`, default 0), which is on in the forward/backward passes when set.
Nothing here moves the model: place it (and the reference) on `select_device()` before
building the optimizer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

import torch

from learning_loop.batch import TrainingSample
from learning_loop.data_parallel import RankGroup
from learning_loop.objective import (
    ObjectiveStats,
    differentiable_token_entropy,
    grpo_loss,
    policy_action_logprobs,
    token_entropy,
    token_logprobs,
)
from learning_loop.sequences import SequenceBatch, collate_sequences, pack_samples
from triloop.run_config import ObjectiveConfig, OptimizerConfig, RunConfig, UpdateConfig


class UpdateError(RuntimeError):
    """The update cannot run as asked (wrong device, samples from a future policy)."""


@dataclass(frozen=True)
class UpdateSettings:
    """What `update_policy` needs from a run configuration."""

    objective: ObjectiveConfig = ObjectiveConfig()
    update: UpdateConfig = UpdateConfig()
    # The rollouts' sampling temperature (unitless, > 0): logprobs are compared at it.
    temperature: float = 1.0

    @classmethod
    def from_run(cls, run: RunConfig) -> UpdateSettings:
        """The update settings of a whole run configuration."""
        return cls(objective=run.objective, update=run.update,
                   temperature=run.rollout.temperature)


@dataclass(frozen=True)
class OffPolicyReport:
    """What the off-policy guard did with samples older than `max_staleness`."""

    stale_policy: str  # the configured action: "drop" or "importance_correct"
    stale_dropped: int = 0  # samples dropped
    stale_corrected: int = 0  # samples importance-corrected
    max_staleness_seen: int = 0  # policy versions between the oldest sample and the policy
    mean_importance_weight: float | None = None  # over corrected tokens, after truncation
    truncated_weight_share: float | None = None  # share of corrected tokens at the cap


@dataclass(frozen=True)
class UpdateMetrics:
    """What one update did and measured; stored with the iteration's `training_step`."""

    loss: float  # objective summed over mini-batches / optimizer steps
    grad_norm: float | None  # pre-clip global L2 norm, mean over steps taken (None if none)
    grad_norm_max: float | None  # largest finite pre-clip norm of those steps
    clip_fraction: float  # share of action tokens whose ratio was clipped
    clip_fraction_low: float
    clip_fraction_high: float
    approx_kl: float  # nats per token, KL(behaviour || current) by k3
    reference_kl: float | None  # nats per token, KL(current || reference); None without one
    entropy: float  # nats per action token
    trainable_tokens: int  # action tokens the loss covered
    total_tokens: int  # all non-padding tokens fed through the model
    samples: int  # samples trained on
    off_policy: OffPolicyReport
    optimizer_steps: int
    skipped_steps: int  # steps skipped because the gradient norm was not finite
    learning_rate: float  # after the last step
    device: str
    seconds: float  # wall clock of the whole update

    @property
    def trainable_tokens_per_second(self) -> float:
        """Update throughput in action tokens per second."""
        return self.trainable_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        """Plain, JSON-ready dict for storage (no NaN or infinity)."""
        return asdict(self)


def select_device() -> torch.device:
    """CUDA when present, otherwise CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_optimizer(
    model: torch.nn.Module, config: OptimizerConfig
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over trainable parameters and a linear warm-up to a constant rate."""
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=config.learning_rate,
        betas=(config.beta1, config.beta2),
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
    )
    warmup = config.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
    )
    return optimizer, scheduler


def set_learning_rate(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, rate: float
) -> None:
    """Make ``rate`` the peak learning rate from now on (warm-up position kept).

    A resumed optimizer and scheduler restore the rate they were saved with; the run's
    rate (which a mitigation may have lowered) is the one that counts.
    """
    scheduler.base_lrs = [rate] * len(optimizer.param_groups)
    factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
    for group in optimizer.param_groups:
        group["initial_lr"], group["lr"] = rate, rate * factor


def update_policy(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[TrainingSample],
    config: UpdateSettings,
    *,
    policy_version: int,
    reference: torch.nn.Module | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    device: torch.device | None = None,
    pad_token_id: int = 0,
    ranks: RankGroup | None = None,
) -> UpdateMetrics:
    """Run one GRPO update of `model` (at `policy_version`) on `samples`."""
    started = time.perf_counter()
    device = device or next(model.parameters()).device
    _check_device(model, device, "model")
    if reference is not None:
        _check_device(reference, device, "reference")
    was_training = model.training
    model.eval()
    try:
        kept, guard = _guard_staleness(model, samples, config.update, policy_version, device,
                                       config.temperature)
        stats, norms, loss, skipped, fed = ObjectiveStats(), [], 0.0, 0, 0
        for mini in _split(kept, config.update.optimizer_steps_per_batch):
            with adapter_dropout(model, config.update):
                mini_stats, mini_loss, mini_fed = _accumulate(model, mini, config, reference,
                                                              device, pad_token_id, ranks)
            if ranks is not None:
                ranks.sum_gradients(model)
                mini_stats, mini_loss = ranks.sum_stats(mini_stats, mini_loss,
                                                        with_reference=reference is not None)
            stats, loss, fed = stats.merge(mini_stats), loss + mini_loss, fed + mini_fed
            norm = float(torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], config.update.max_grad_norm
            ))
            norms.append(norm)
            if math.isfinite(norm):
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
            else:
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
    finally:
        model.train(was_training)
    finite = [n for n in norms if math.isfinite(n)]
    return UpdateMetrics(
        loss=loss,
        grad_norm=sum(finite) / len(finite) if finite else None,
        grad_norm_max=max(finite) if finite else None,
        clip_fraction=stats.clip_fraction,
        clip_fraction_low=stats.clip_fraction_low,
        clip_fraction_high=stats.clip_fraction_high,
        approx_kl=stats.approx_kl,
        reference_kl=stats.reference_kl,
        entropy=stats.entropy,
        trainable_tokens=int(stats.action_tokens),
        total_tokens=fed,
        samples=len(kept),
        optimizer_steps=len(norms) - skipped,
        skipped_steps=skipped,
        learning_rate=float(optimizer.param_groups[0]["lr"]),
        device=str(device),
        seconds=time.perf_counter() - started,
        off_policy=guard,
    )


def _accumulate(
    model: torch.nn.Module,
    samples: Sequence[TrainingSample],
    config: UpdateSettings,
    reference: torch.nn.Module | None,
    device: torch.device,
    pad_token_id: int,
    ranks: RankGroup | None = None,
) -> tuple[ObjectiveStats, float, int]:
    # The normalizer is the mini-batch total, so micro-batch gradients add up to its gradient.
    if config.objective.aggregation == "token":
        normalizer = float(sum(len(s.action_token_ids) for s in samples))
    else:
        normalizer = float(len(samples))
    stats, loss, fed = ObjectiveStats(), 0.0, 0
    mine = ranks.shard(samples) if ranks is not None else samples
    for batch in _micro_batches(mine, config.update.micro_batch_size, pad_token_id, device):
        fed += int(batch.attention_mask.sum())
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        reference_logprobs = None
        if reference is not None:
            with torch.no_grad():
                ref_logits = reference(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask
                ).logits
                reference_logprobs = token_logprobs(ref_logits, batch.input_ids,
                                                    config.temperature)
        out = grpo_loss(
            token_logprobs(logits, batch.input_ids, config.temperature),
            batch.behaviour_logprobs,
            batch.advantages,
            batch.action_mask,
            config.objective,
            reference_logprobs=reference_logprobs,
            importance_weights=batch.importance_weights,
            entropy=(differentiable_token_entropy(logits) if config.objective.entropy_coef > 0
                     else token_entropy(logits)),
            normalizer=normalizer,
            turn_weights=batch.turn_weights,
        )
        torch.autograd.backward(out.loss)
        stats, loss = stats.merge(out.stats), loss + float(out.loss.detach())
    return stats, loss, fed


@contextmanager
def adapter_dropout(model: torch.nn.Module, config: UpdateConfig) -> Iterator[None]:
    """LoRA's adapter dropout on for the block when ``update.lora.dropout`` asks for it."""
    rate = config.lora.dropout if config.lora is not None else 0.0
    dropouts = [m for name, m in model.named_modules()
                if rate > 0 and name.rsplit(".", 2)[-2:-1] == ["lora_dropout"]]
    for module in dropouts:
        module.train(True)
    try:
        yield
    finally:
        for module in dropouts:
            module.train(False)


def _guard_staleness(
    model: torch.nn.Module,
    samples: Sequence[TrainingSample],
    config: UpdateConfig,
    policy_version: int,
    device: torch.device,
    temperature: float,
) -> tuple[list[TrainingSample], OffPolicyReport]:
    staleness = [policy_version - s.policy_version for s in samples]
    if staleness and min(staleness) < 0:
        raise UpdateError(
            f"a sample comes from policy version {policy_version - min(staleness)}, newer than"
            f" the policy being updated ({policy_version}); pass the current policy_version"
        )
    fresh = [s for s, age in zip(samples, staleness, strict=True) if age <= config.max_staleness]
    stale = [s for s, age in zip(samples, staleness, strict=True) if age > config.max_staleness]
    report = OffPolicyReport(config.stale_samples, max_staleness_seen=max(staleness, default=0))
    if not stale:
        return fresh, report
    if config.stale_samples == "drop":
        return fresh, replace(report, stale_dropped=len(stale))
    corrected: dict[int, TrainingSample] = {}
    weights: list[float] = []
    proximal_logprobs = policy_action_logprobs(model, stale, device=device,
                                               temperature=temperature)
    for s, proximal in zip(stale, proximal_logprobs, strict=True):
        # Decoupled PPO: clip against the current (proximal) policy, weight by the truncated
        # proximal/behaviour ratio so stale data is neither ignored nor over-trusted.
        w = [min(math.exp(min(p - b, 20.0)), config.importance_weight_cap)
             for p, b in zip(proximal, s.behaviour_logprobs, strict=True)]
        weights.extend(w)
        corrected[id(s)] = replace(
            s, behaviour_logprobs=tuple(proximal), importance_weights=tuple(w)
        )
    kept = [corrected.get(id(s), s) for s in samples]  # the caller's order
    return kept, replace(
        report,
        stale_corrected=len(stale),
        mean_importance_weight=sum(weights) / len(weights),
        truncated_weight_share=sum(w >= config.importance_weight_cap for w in weights)
        / len(weights),
    )


def _micro_batches(
    samples: Sequence[TrainingSample], size: int, pad_token_id: int, device: torch.device
) -> Iterator[SequenceBatch]:
    """Micro-batches of `size` packed sequences (one per trajectory segment), longest first."""
    ordered = sorted(pack_samples(samples), key=lambda s: s.length, reverse=True)
    for start in range(0, len(ordered), size):
        yield collate_sequences(ordered[start : start + size],
                                pad_token_id=pad_token_id).to(device)


def _split(samples: Sequence[TrainingSample], parts: int) -> list[list[TrainingSample]]:
    """`parts` contiguous, near-equal, non-empty chunks (fewer if there are fewer
    trajectories), cut between trajectories so each keeps its one forward pass."""
    units: list[list[TrainingSample]] = []
    for sample in samples:
        if units and units[-1][0].trajectory_id == sample.trajectory_id:
            units[-1].append(sample)
        else:
            units.append([sample])
    parts = min(parts, len(units))
    bounds = [round(k * len(units) / parts) for k in range(parts + 1)] if parts else [0]
    return [[s for unit in units[a:b] for s in unit]
            for a, b in zip(bounds, bounds[1:], strict=False)]


def _check_device(module: torch.nn.Module, device: torch.device, name: str) -> None:
    found = {p.device for p in module.parameters()}
    if any(d.type != device.type or (device.index is not None and d.index != device.index)
           for d in found):
        raise UpdateError(
            f"the {name} has parameters on {sorted(map(str, found))} but the update runs on"
            f" {device}; move it with .to({str(device)!r}) before building the optimizer"
        )
