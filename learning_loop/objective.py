"""The GRPO clipped policy objective over action tokens, with an optional k3 KL penalty.

For every action token t of sample i (action mask = 1), with the advantage A_i of the
sample's trajectory and the behaviour logprob stored at rollout:

    r_t     = exp(logp_theta(t) - logp_behaviour(t))                  per-token ratio
    l_t     = -min(r_t * A_i, clip(r_t, 1 - eps_low, 1 + eps_high) * A_i) * w_t
            + beta * k3_t - alpha * H_t,
              k3_t = exp(logp_ref - logp_theta) - (logp_ref - logp_theta) - 1

and the loss aggregates l_t over masked tokens only:

    "token"    sum_t l_t / (action tokens in the batch)                 (DAPO)
    "sequence" mean_i (sum_{t in i} l_t / |i|)                          (GRPO paper)

This is GRPO as in Shao et al. (2024), with these departures:
- separate lower and upper clip ranges ("clip-higher", DAPO, Yu et al., 2025), so
  unlikely tokens with positive advantage can grow more than likely ones shrink;
- token-level aggregation is available and is the default (DAPO): long answers are not
  down-weighted per token as the per-sequence mean does;
- the ratio is taken against the stored behaviour logprobs of the rollout policy, not
  recomputed "old" logprobs: rollouts come from another process (vLLM or the torch
  backend) and may be a version or more behind (asynchronous, bounded staleness);
- w_t is 1 except for stale samples the update chose to importance-correct: their
  "behaviour" logprobs are replaced by the current policy's (proximal) logprobs and w_t
  is the truncated ratio proximal/behaviour (decoupled PPO, Hilton et al., 2022);
- the log-ratio is clamped to +-20 before exp so a wildly stale token cannot make the
  loss infinite; the clamped token then gets no gradient;
- the KL penalty is in the loss (as in GRPO), not in the reward, and beta = 0 (default,
  as in DAPO / Dr. GRPO) needs no reference model at all;
- an optional entropy bonus alpha * H_t (H_t the policy's entropy at token t, nats;
  alpha = `entropy_coef`, default 0 as in GRPO), which a stability mitigation may raise
  when an alarm says exploration is collapsing;
- logp_theta (and logp_ref) are taken at the rollout's sampling temperature T, softmax of
  logits / T, because the behaviour logprobs were: at T != 1 an untempered learner would
  see ratios far from 1 on perfectly on-policy data.

The module also holds the teacher-forced scoring the update and the monitors share:
`token_logprobs`, `token_entropy`, `policy_action_logprobs` (a sample's action tokens under
a model) and `score_cross_input` (every response against every prompt, for the
cross-input discrimination monitor).

`normalizer` lets the update split a batch into micro-batches and still get exactly the
gradient of the whole batch: pass the batch's total action tokens ("token") or samples
("sequence").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from learning_loop.batch import TrainingSample
from learning_loop.sequences import collate_sequences, pack_samples_indexed
from triloop.run_config import ObjectiveConfig

_LOG_RATIO_LIMIT = 20.0


class ObjectiveInputError(ValueError):
    """Tensors or settings the objective cannot work with; the message says which."""


@dataclass(frozen=True)
class ObjectiveStats:
    """Token-summed statistics of one objective call; `merge` adds micro-batches up."""

    action_tokens: float = 0.0
    clipped_low_tokens: float = 0.0  # A < 0 and ratio < 1 - eps_low: the clip is active
    clipped_high_tokens: float = 0.0  # A > 0 and ratio > 1 + eps_high: the clip is active
    approx_kl_sum: float = 0.0  # k3 estimate of KL(behaviour || current), summed over tokens
    entropy_sum: float = 0.0  # nats, summed over tokens
    reference_kl_sum: float | None = None  # k3 estimate of KL(current || reference)

    def merge(self, other: ObjectiveStats) -> ObjectiveStats:
        """Sum of two statistics (reference KL stays None unless either has it)."""
        ref: float | None = None
        if self.reference_kl_sum is not None or other.reference_kl_sum is not None:
            ref = (self.reference_kl_sum or 0.0) + (other.reference_kl_sum or 0.0)
        return replace(
            self,
            action_tokens=self.action_tokens + other.action_tokens,
            clipped_low_tokens=self.clipped_low_tokens + other.clipped_low_tokens,
            clipped_high_tokens=self.clipped_high_tokens + other.clipped_high_tokens,
            approx_kl_sum=self.approx_kl_sum + other.approx_kl_sum,
            entropy_sum=self.entropy_sum + other.entropy_sum,
            reference_kl_sum=ref,
        )

    def _mean(self, total: float) -> float:
        return total / self.action_tokens if self.action_tokens else 0.0

    @property
    def clip_fraction(self) -> float:
        """Share of action tokens whose ratio was clipped (either side)."""
        return self._mean(self.clipped_low_tokens + self.clipped_high_tokens)

    @property
    def clip_fraction_low(self) -> float:
        """Share of action tokens clipped at 1 - eps_low."""
        return self._mean(self.clipped_low_tokens)

    @property
    def clip_fraction_high(self) -> float:
        """Share of action tokens clipped at 1 + eps_high."""
        return self._mean(self.clipped_high_tokens)

    @property
    def approx_kl(self) -> float:
        """Mean k3 KL(behaviour || current) per action token (nats)."""
        return self._mean(self.approx_kl_sum)

    @property
    def entropy(self) -> float:
        """Mean policy entropy per action token (nats)."""
        return self._mean(self.entropy_sum)

    @property
    def reference_kl(self) -> float | None:
        """Mean k3 KL(current || reference) per action token (nats), None without reference."""
        return None if self.reference_kl_sum is None else self._mean(self.reference_kl_sum)


@dataclass(frozen=True)
class ObjectiveOutput:
    """The loss to backpropagate and the statistics of this call."""

    loss: torch.Tensor
    stats: ObjectiveStats


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log p_T(token t+1 | tokens <= t) for t in 0..L-2: shape [B, L-1], aligned with targets.

    ``temperature`` is the sampling temperature the behaviour logprobs were taken at: the
    ratio compares the same tempered distribution on both sides.
    """
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the next-token distribution at positions 0..L-2: shape [B, L-1]."""
    return differentiable_token_entropy(logits)


def differentiable_token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """`token_entropy` with its gradient kept, for the entropy bonus."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


@torch.no_grad()
def policy_action_logprobs(
    model: torch.nn.Module,
    samples: Sequence[TrainingSample],
    *,
    device: torch.device,
    micro_batch_size: int = 8,
    temperature: float = 1.0,
) -> list[list[float]]:
    """The model's logprob of each action token of each sample (teacher forcing, at T).

    Turns of one trajectory are scored in one forward pass over its packed sequence
    (``learning_loop.sequences``); the result is in the samples' order.
    """
    result: list[list[float]] = [[] for _ in samples]
    packed = pack_samples_indexed(samples)
    for start in range(0, len(packed), micro_batch_size):
        chunk = packed[start : start + micro_batch_size]
        batch = collate_sequences([sequence for sequence, _ in chunk]).to(device)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logp = token_logprobs(logits, batch.input_ids, temperature).float().cpu()
        for row, (sequence, positions) in enumerate(chunk):
            for (first, end), position in zip(sequence.spans, positions, strict=True):
                result[position] = logp[row, first - 1 : end - 1].tolist()
    return result


@torch.no_grad()
def score_cross_input(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    device: torch.device,
    micro_batch_size: int = 16,
) -> list[list[float]]:
    """scores[j][i] = log p(response j | prompt i), summed over response tokens."""
    pairs = [
        TrainingSample("", "", "", 0, tuple(p), tuple(r), (0.0,) * len(r), 0.0)
        for r in responses
        for p in prompts
    ]
    was_training = model.training
    model.eval()
    try:
        flat = policy_action_logprobs(
            model, pairs, device=device, micro_batch_size=micro_batch_size
        )
    finally:
        model.train(was_training)
    n = len(prompts)
    return [[sum(flat[j * n + i]) for i in range(n)] for j in range(len(responses))]


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    config: ObjectiveConfig,
    *,
    reference_logprobs: torch.Tensor | None = None,
    importance_weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    normalizer: float | None = None,
    turn_weights: torch.Tensor | None = None,
) -> ObjectiveOutput:
    """GRPO loss over action-mask tokens; per-token tensors are [B, T].

    ``advantages`` is one per sample [B], or one per token [B, T] when a row packs
    several turns (``learning_loop.sequences``); then ``turn_weights`` (1/|turn| on each
    action token) makes the "sequence" aggregation a mean over turns, and its
    ``normalizer`` counts turns.
    """
    _check_shapes(logprobs, behaviour_logprobs, advantages, action_mask)
    if config.kl_coef > 0 and reference_logprobs is None:
        raise ObjectiveInputError(
            f"kl_coef is {config.kl_coef} but no reference logprobs were given;"
            " pass the frozen reference model or set objective.kl_coef to 0"
        )
    mask = action_mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    log_ratio = (logprobs - behaviour_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    if importance_weights is not None:
        per_token = per_token * importance_weights.detach()
    reference_kl: torch.Tensor | None = None
    if reference_logprobs is not None:
        ref_log_ratio = (reference_logprobs.detach() - logprobs).clamp(
            -_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT
        )
        reference_kl = ref_log_ratio.exp() - ref_log_ratio - 1.0
        if config.kl_coef > 0:
            per_token = per_token + config.kl_coef * reference_kl
    if config.entropy_coef > 0:
        if entropy is None or not entropy.requires_grad:
            raise ObjectiveInputError(
                f"entropy_coef is {config.entropy_coef} but no differentiable entropy was"
                " given; pass differentiable_token_entropy(logits) or set it to 0"
            )
        per_token = per_token - config.entropy_coef * entropy
    loss = _aggregate(per_token, mask, config, normalizer, turn_weights)
    with torch.no_grad():
        on = mask.bool()
        stats = ObjectiveStats(
            action_tokens=float(mask.sum()),
            clipped_low_tokens=float(((adv < 0) & (ratio < 1.0 - config.clip_eps_low) & on).sum()),
            clipped_high_tokens=float(
                ((adv > 0) & (ratio > 1.0 + config.clip_eps_high) & on).sum()
            ),
            approx_kl_sum=float((((ratio - 1.0) - log_ratio) * mask).sum()),
            entropy_sum=float((entropy * mask).sum()) if entropy is not None else 0.0,
            reference_kl_sum=(
                float((reference_kl * mask).sum()) if reference_kl is not None else None
            ),
        )
    return ObjectiveOutput(loss=loss, stats=stats)


def _aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, config: ObjectiveConfig, normalizer: float | None,
    turn_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    if config.aggregation == "token":
        denominator = normalizer if normalizer is not None else float(mask.sum())
        return (per_token * mask).sum() / max(denominator, 1.0)
    if turn_weights is not None:  # rows pack several turns: the mean of per-turn means
        weighted = mask * turn_weights.to(per_token.dtype)
        turns = normalizer if normalizer is not None else float(weighted.sum().round())
        return (per_token * weighted).sum() / max(turns, 1.0)
    tokens_per_sample = mask.sum(-1)
    per_sample = (per_token * mask).sum(-1) / tokens_per_sample.clamp(min=1.0)
    samples = normalizer if normalizer is not None else float((tokens_per_sample > 0).sum())
    return per_sample.sum() / max(samples, 1.0)


def _check_shapes(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
) -> None:
    if logprobs.dim() != 2:
        raise ObjectiveInputError(f"logprobs must be [batch, tokens], got {tuple(logprobs.shape)}")
    for name, t in (("behaviour_logprobs", behaviour_logprobs), ("action_mask", action_mask)):
        if t.shape != logprobs.shape:
            raise ObjectiveInputError(
                f"{name} has shape {tuple(t.shape)}, logprobs {tuple(logprobs.shape)}"
            )
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ObjectiveInputError(
            f"advantages must be one per sample [{logprobs.shape[0]}] or one per token"
            f" {list(logprobs.shape)}, got {tuple(advantages.shape)}"
        )
