"""One forward pass per trajectory gives the per-turn layout's loss and gradient.

Both layouts run in float64 on the same tiny Qwen2. Packing changes only how the same
products are grouped (a longer attention row instead of several shorter ones), so the
two agree to rounding. The coarsest rounding in the model is float32's: transformers
builds the rotary cos/sin table in float32 whatever the model's dtype, and a table of a
different length can round a position's entry differently by an ulp (vectorised body
against scalar tail). So the tolerance is 16 float32 ulps of the largest magnitude
compared (about 2e-6 relative; measured differences are below one ulp), far below any
real difference (a wrong mask, advantage or position moves the loss by 1e-4 or more).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from learning_loop.batch import TrainingSample, collate
from learning_loop.objective import grpo_loss, policy_action_logprobs, token_logprobs
from learning_loop.sequences import collate_sequences, pack_samples
from learning_loop.update import UpdateSettings, build_optimizer, update_policy
from triloop.run_config import ObjectiveConfig, OptimizerConfig, UpdateConfig

ULPS = 16
EPS = torch.finfo(torch.float32).eps


def tiny_model() -> PreTrainedModel:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    return model.double().eval()


def turns_of(tid: str, prompts: list[list[int]], actions: list[list[int]],
             advantages: list[float]) -> list[TrainingSample]:
    return [TrainingSample(tid, "g", "task", 0, tuple(p), tuple(a),
                           tuple(-1.0 - 0.1 * i for i in range(len(a))), adv)
            for p, a, adv in zip(prompts, actions, advantages, strict=True)]


def episodes() -> list[TrainingSample]:
    """A 3-turn trajectory whose prompts extend, and one whose history was rewritten;
    every turn with its own advantage (turn-level credit)."""
    p1, a1 = [1, 2, 3], [4, 5]
    p2, a2 = [*p1, *a1, 6, 7], [8]
    p3, a3 = [*p2, *a2, 9, 10, 11], [12, 13, 14]
    q1, b1 = [20, 21], [22, 23]
    q2, b2 = [20, 30, 31], [32]  # does not extend q1 + b1: a segment of its own
    return [*turns_of("a", [p1, p2, p3], [a1, a2, a3], [1.0, -0.5, 0.25]),
            *turns_of("b", [q1, q2], [b1, b2], [-1.0, 0.75])]


def loss_and_grads(model: PreTrainedModel, packed: bool, samples: list[TrainingSample],
                   config: ObjectiveConfig) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    normalizer = (float(sum(len(s.action_token_ids) for s in samples))
                  if config.aggregation == "token" else float(len(samples)))
    if packed:
        batch = collate_sequences(pack_samples(samples))
        turn_weights: torch.Tensor | None = batch.turn_weights
    else:
        batch, turn_weights = collate(samples), None  # type: ignore[assignment]
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    out = grpo_loss(token_logprobs(logits, batch.input_ids), batch.behaviour_logprobs.double(),
                    batch.advantages.double(), batch.action_mask.double(), config,
                    importance_weights=batch.importance_weights.double(),
                    normalizer=normalizer, turn_weights=turn_weights)
    out.loss.backward()
    return float(out.loss.detach()), [p.grad.detach().clone() for p in model.parameters()
                             if p.grad is not None]


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-300)
    return float((a - b).abs().max()) <= ULPS * EPS * scale


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_packed_loss_and_gradient_equal_the_per_turn_layout(aggregation: str) -> None:
    model = tiny_model()
    config = ObjectiveConfig(aggregation=aggregation)  # type: ignore[arg-type]
    samples = episodes()
    samples[1] = replace(samples[1], importance_weights=(0.5,))  # a corrected turn, too
    per_turn_loss, per_turn = loss_and_grads(model, False, samples, config)
    packed_loss, packed = loss_and_grads(model, True, samples, config)
    assert close(torch.tensor(per_turn_loss), torch.tensor(packed_loss))
    assert len(per_turn) == len(packed)
    assert all(close(a, b) for a, b in zip(per_turn, packed, strict=True))
    # and a real difference is far outside the tolerance
    samples[0] = replace(samples[0], advantage=1.001)
    moved_loss, _ = loss_and_grads(model, True, samples, config)
    assert not close(torch.tensor(per_turn_loss), torch.tensor(moved_loss))


def test_turns_pack_one_row_per_trajectory_segment() -> None:
    packed = pack_samples(episodes())
    assert [(s.trajectory_id, s.length, len(s.spans)) for s in packed] == [
        ("a", 14, 3), ("b", 4, 1), ("b", 4, 1)]
    assert packed[0].spans == ((3, 5), (7, 8), (11, 14))
    assert packed[0].advantages == (1.0, -0.5, 0.25)


def test_the_update_runs_one_forward_row_per_trajectory() -> None:
    model = tiny_model().float()
    rows: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kwargs: rows.append(int(kwargs["input_ids"].shape[0])), with_kwargs=True)
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    samples = [s for s in episodes() if s.trajectory_id == "a"] + [
        replace(s, trajectory_id=f"c{k}") for k, s in enumerate(episodes()[:1])]
    metrics = update_policy(model, optimizer, samples,
                            UpdateSettings(update=UpdateConfig(micro_batch_size=8)),
                            policy_version=0)
    assert sum(rows) == 2  # trajectory "a" (3 turns) and "c0": two rows, one forward
    assert metrics.samples == 4 and metrics.trainable_tokens == 2 + 1 + 3 + 2
    assert metrics.total_tokens == 14 + 5  # each trajectory's tokens once


def test_scoring_packs_turns_and_keeps_the_samples_order() -> None:
    model = tiny_model()
    rows: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kwargs: rows.append(int(kwargs["input_ids"].shape[0])), with_kwargs=True)
    samples = episodes()
    shuffled = [samples[3], samples[0], samples[1], samples[4], samples[2]]  # interleaved
    packed = policy_action_logprobs(model, shuffled, device=torch.device("cpu"))
    assert sum(rows) == 3  # "a" in one row, "b" in its two segments
    for sample, got in zip(shuffled, packed, strict=True):
        alone = policy_action_logprobs(model, [sample], device=torch.device("cpu"))[0]
        assert len(got) == len(sample.action_token_ids)
        assert close(torch.tensor(got, dtype=torch.float64), torch.tensor(alone))


def test_mini_batches_are_cut_between_trajectories() -> None:
    model = tiny_model().float()
    rows: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kwargs: rows.append(int(kwargs["input_ids"].shape[0])), with_kwargs=True)
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    samples = [s for s in episodes() if s.trajectory_id == "a"] + [
        replace(s, trajectory_id="c") for s in episodes()[:2]]
    metrics = update_policy(model, optimizer, samples,
                            UpdateSettings(update=UpdateConfig(optimizer_steps_per_batch=2)),
                            policy_version=0)
    assert metrics.optimizer_steps == 2 and rows == [1, 1]  # "a" whole, then "c" whole
