"""GRPO objective against hand-computed values: masking, clipping, aggregation, KL, metrics."""

from __future__ import annotations

import math

import pytest
import torch

from learning_loop.objective import (
    ObjectiveInputError,
    ObjectiveStats,
    grpo_loss,
    token_entropy,
    token_logprobs,
)
from triloop.run_config import ObjectiveConfig

LN = math.log
CFG = ObjectiveConfig(clip_eps_low=0.2, clip_eps_high=0.28)


def t(rows: list[list[float]], grad: bool = False) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64, requires_grad=grad)


def test_only_masked_tokens_count() -> None:
    # Off-mask positions hold absurd values; they must not change the loss or get gradient.
    logp = t([[-50.0, LN(0.5), LN(0.5), 9.0]], grad=True)
    behaviour = t([[0.0, LN(0.5), LN(0.5), -80.0]])
    mask = t([[0.0, 1.0, 1.0, 0.0]])
    out = grpo_loss(logp, behaviour, torch.tensor([2.0]), mask, CFG)
    assert out.loss.item() == pytest.approx(-2.0)  # ratio 1 -> -A per token, mean over 2
    torch.autograd.backward(out.loss)
    assert logp.grad is not None
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, -1.0, -1.0, 0.0])
    assert out.stats.action_tokens == 2.0 and out.stats.clip_fraction == 0.0


def test_clipping_on_both_sides() -> None:
    # One token per sample: (A, ratio) = (+1, 1.5) (-1, 0.5) (+1, 0.5) (-1, 1.5)
    logp = t([[LN(1.5)], [LN(0.5)], [LN(0.5)], [LN(1.5)]], grad=True)
    behaviour = torch.zeros(4, 1, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    out = grpo_loss(logp, behaviour, adv, torch.ones(4, 1), CFG)
    # per token: -min(1.5, 1.28) = -1.28 | -min(-0.5, -0.8) = 0.8 | -0.5 | -min(-1.5, -1.28) = 1.5
    assert out.loss.item() == pytest.approx((-1.28 + 0.8 - 0.5 + 1.5) / 4)
    torch.autograd.backward(out.loss)
    assert logp.grad is not None
    # Clipped tokens get no gradient; unclipped ones get -A * ratio / 4.
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, 0.0, -0.125, 0.375])
    assert out.stats.clip_fraction_high == 0.25
    assert out.stats.clip_fraction_low == 0.25
    assert out.stats.clip_fraction == 0.5


def test_asymmetric_clip_ranges() -> None:
    # ratio 1.25 with A > 0 is inside 1 + 0.28 but outside a symmetric 1 + 0.2.
    logp, behaviour = t([[LN(1.25)]]), t([[0.0]])
    adv, mask = torch.tensor([1.0]), torch.ones(1, 1)
    higher = grpo_loss(logp, behaviour, adv, mask, CFG)
    symmetric = grpo_loss(logp, behaviour, adv, mask, ObjectiveConfig(clip_eps_high=0.2))
    assert higher.loss.item() == pytest.approx(-1.25)
    assert symmetric.loss.item() == pytest.approx(-1.2)


def test_token_and_sequence_aggregation() -> None:
    # Sample 0: one token, A = 1 -> per-token loss -1. Sample 1: three tokens, A = -2 -> 2 each.
    logp = torch.zeros(2, 3, dtype=torch.float64)
    mask = t([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -2.0])
    token = grpo_loss(logp, logp, adv, mask, CFG)
    sequence = grpo_loss(logp, logp, adv, mask, ObjectiveConfig(aggregation="sequence"))
    assert token.loss.item() == pytest.approx((-1 + 6) / 4)
    assert sequence.loss.item() == pytest.approx((-1 + 2) / 2)


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_normalizer_makes_micro_batches_add_up(aggregation: str) -> None:
    config = ObjectiveConfig.model_validate({"aggregation": aggregation})
    torch.manual_seed(0)
    logp = (torch.rand(4, 5, dtype=torch.float64) - 2).requires_grad_()
    behaviour = torch.rand(4, 5, dtype=torch.float64) - 2
    mask = t([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])
    whole = grpo_loss(logp, behaviour, adv, mask, config)
    norm = float(mask.sum()) if aggregation == "token" else 4.0
    parts = [grpo_loss(logp[s], behaviour[s], adv[s], mask[s], config, normalizer=norm)
             for s in (slice(0, 1), slice(1, 4))]
    assert sum(p.loss.item() for p in parts) == pytest.approx(whole.loss.item())
    (g_whole,) = torch.autograd.grad(whole.loss, logp)
    (g_parts,) = torch.autograd.grad(parts[0].loss + parts[1].loss, logp)
    assert torch.allclose(g_whole, g_parts)


def test_k3_kl_to_reference() -> None:
    logp = t([[LN(0.5)]], grad=True)
    reference = t([[LN(0.25)]])
    config = ObjectiveConfig(kl_coef=0.1)
    out = grpo_loss(logp, logp.detach(), torch.tensor([0.0]), torch.ones(1, 1), config,
                    reference_logprobs=reference)
    k3 = 0.5 - LN(0.5) - 1.0  # exp(ref - logp) - (ref - logp) - 1
    assert out.stats.reference_kl == pytest.approx(k3)
    assert out.loss.item() == pytest.approx(0.1 * k3)
    torch.autograd.backward(out.loss)
    assert logp.grad is not None  # d/dlogp = 0.1 * (1 - exp(ref - logp)) = 0.05
    assert logp.grad.item() == pytest.approx(0.05)


def test_reference_without_coefficient_is_only_measured() -> None:
    logp = t([[LN(0.5)]])
    out = grpo_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), CFG,
                    reference_logprobs=t([[LN(0.25)]]))
    assert out.loss.item() == 0.0
    assert out.stats.reference_kl == pytest.approx(0.5 - LN(0.5) - 1.0)


def test_kl_coefficient_needs_a_reference() -> None:
    logp = t([[0.0]])
    with pytest.raises(ObjectiveInputError, match="no reference"):
        grpo_loss(logp, logp, torch.tensor([1.0]), torch.ones(1, 1), ObjectiveConfig(kl_coef=0.1))


def test_approx_kl_and_entropy_metrics() -> None:
    # ratio 0.5 -> k3 = (0.5 - 1) - ln 0.5; the off-mask token (ratio e^5) must not count.
    logp = t([[LN(0.25), 0.0]])
    behaviour = t([[LN(0.5), -5.0]])
    entropy = t([[1.5, 100.0]])
    out = grpo_loss(logp, behaviour, torch.tensor([1.0]), t([[1.0, 0.0]]), CFG, entropy=entropy)
    assert out.stats.approx_kl == pytest.approx(-0.5 - LN(0.5))
    assert out.stats.entropy == pytest.approx(1.5)
    assert out.stats.reference_kl is None


def test_importance_weights_scale_the_policy_term() -> None:
    logp = torch.zeros(1, 2, dtype=torch.float64)
    weights = t([[0.5, 2.0]])
    out = grpo_loss(logp, logp, torch.tensor([1.0]), torch.ones(1, 2), CFG,
                    importance_weights=weights)
    assert out.loss.item() == pytest.approx(-(0.5 + 2.0) / 2)


def test_stats_merge_weights_by_tokens() -> None:
    a = ObjectiveStats(action_tokens=1, clipped_high_tokens=1, entropy_sum=1.0)
    b = ObjectiveStats(action_tokens=3, entropy_sum=3.0, reference_kl_sum=0.3)
    merged = a.merge(b)
    assert merged.clip_fraction == 0.25 and merged.entropy == 1.0
    assert merged.reference_kl == pytest.approx(0.075)


def test_token_logprobs_are_aligned_with_targets() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    ids = torch.randint(0, 7, (2, 4))
    logp = token_logprobs(logits, ids)
    assert logp.shape == (2, 3)
    expected = torch.log_softmax(logits[1, 1], -1)[ids[1, 2]]
    assert logp[1, 1].item() == pytest.approx(expected.item(), abs=1e-6)


def test_token_entropy_of_uniform_is_log_vocab() -> None:
    entropy = token_entropy(torch.zeros(1, 3, 8))
    assert entropy.shape == (1, 2)
    assert entropy.flatten().tolist() == pytest.approx([LN(8)] * 2)


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(ObjectiveInputError, match="behaviour_logprobs"):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3), CFG)
    with pytest.raises(ObjectiveInputError, match="one per sample"):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3), CFG)
