"""Stability metrics and detectors on synthetic healthy and collapsed batches and histories."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from learning_loop.advantages import TrajectoryReturn
from learning_loop.objective import score_cross_input
from learning_loop.stability import (
    DiscriminationResult,
    IterationMetrics,
    StabilityInputError,
    detect_echo_trap,
    detect_template_collapse,
    distinct_prompt_pairs,
    iteration_metrics,
    percentile,
    retrieval_accuracy,
)
from triloop.run_config import StabilityConfig


def metrics(i: int, **values: Any) -> IterationMetrics:
    base = IterationMetrics(
        iteration=i, reward_mean=0.5, reward_variance=0.25, within_group_reward_variance=0.2,
        zero_variance_group_share=0.0, token_entropy=2.0, grad_norm=1.0, kl=None,
        length_p50=10.0, length_p90=20.0, length_max=30, retrieval_accuracy=None,
        retrieval_chance=None, retrieval_prompts=0,
    )
    return replace(base, **values)


def echo_history(n: int = 6) -> list[IterationMetrics]:
    """Reward stuck at 0.5, variance and entropy sliding down, gradient norm climbing."""
    return [metrics(i, reward_mean=0.5 + 0.005 * (-1) ** i,
                    within_group_reward_variance=0.2 - 0.035 * i,
                    token_entropy=2.0 - 0.2 * i, grad_norm=1.0 + 0.4 * i) for i in range(n)]


def healthy_history(n: int = 6) -> list[IterationMetrics]:
    """Reward climbing, variance and entropy steady, gradient norm steady."""
    return [metrics(i, reward_mean=0.2 + 0.1 * i, within_group_reward_variance=0.2,
                    token_entropy=2.0 - 0.01 * i, grad_norm=1.0) for i in range(n)]


def test_percentile_interpolates() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 1, 5], 90) == pytest.approx(9.0)
    assert percentile([7], 90) == 7
    with pytest.raises(StabilityInputError):
        percentile([], 50)


def test_retrieval_accuracy() -> None:
    diagonal = [[0.0, -5.0, -5.0], [-5.0, 0.0, -5.0], [-5.0, -5.0, 0.0]]
    assert retrieval_accuracy(diagonal).accuracy == 1.0
    shifted = [row[1:] + row[:1] for row in diagonal]
    assert retrieval_accuracy(shifted).accuracy == 0.0
    ignores_input = [[-2.0] * 4 for _ in range(4)]
    result = retrieval_accuracy(ignores_input)
    assert result.accuracy == result.chance == 0.25 and result.prompts == 4
    with pytest.raises(StabilityInputError, match="square"):
        retrieval_accuracy([[0.0, 1.0]])


def test_distinct_prompt_pairs_keep_one_response_per_prompt() -> None:
    pairs = [([1, 2], [3]), ([1, 2], [4]), ([5], [6]), ([7], [8]), ([9], [10])]
    prompts, responses = distinct_prompt_pairs(pairs, limit=3)
    assert prompts == [[1, 2], [5], [7]] and responses == [[3], [6], [8]]


def test_iteration_metrics_from_a_batch() -> None:
    returns = [TrajectoryReturn("a", "g1", "t", 1.0), TrajectoryReturn("b", "g1", "t", 0.0),
               TrajectoryReturn("c", "g2", "t", 1.0), TrajectoryReturn("d", "g2", "t", 1.0)]
    m = iteration_metrics(iteration=3, returns=returns, trajectory_lengths=[4, 8, 12, 40],
                          token_entropy=1.5, grad_norm=0.7, kl=0.01,
                          discrimination=DiscriminationResult(0.75, 0.25, 4))
    assert m.reward_mean == 0.75 and m.reward_variance == pytest.approx(0.1875)
    assert m.within_group_reward_variance == pytest.approx(0.125)  # (0.25 + 0) / 2
    assert m.zero_variance_group_share == 0.5
    assert (m.length_p50, m.length_max) == (10.0, 40)
    assert m.length_p90 == pytest.approx(31.6)
    assert m.retrieval_accuracy == 0.75 and m.as_dict()["retrieval_prompts"] == 4


def test_echo_trap_fires_on_the_collapsed_history() -> None:
    alarm = detect_echo_trap(echo_history())
    assert alarm is not None and alarm.kind == "echo_trap" and alarm.iteration == 5
    assert alarm.evidence["grad_norm_change"] > 0.3
    assert alarm.evidence["entropy_change"] < -0.1
    assert "echo trap" in alarm.message


def test_echo_trap_quiet_on_a_healthy_history() -> None:
    assert detect_echo_trap(healthy_history()) is None


@pytest.mark.parametrize(
    "healthy_signal",
    [
        {"reward_mean": lambda i: 0.2 + 0.1 * i},  # reward still improving: no plateau
        {"grad_norm": lambda i: 1.0},  # gradient norm steady
        {"token_entropy": lambda i: 2.0},  # entropy steady
        {"within_group_reward_variance": lambda i: 0.2},  # variance steady
    ],
)
def test_echo_trap_needs_all_four_signals(healthy_signal: dict[str, object]) -> None:
    ((field, value),) = healthy_signal.items()
    history = [replace(m, **{field: value(m.iteration)})  # type: ignore[operator]
               for m in echo_history()]
    assert detect_echo_trap(history) is None


def test_echo_trap_needs_a_full_window() -> None:
    assert detect_echo_trap(echo_history(5)) is None
    longer = healthy_history(10)[:4] + echo_history(6)
    assert detect_echo_trap(longer) is not None  # only the last window counts
    assert detect_echo_trap(echo_history(), StabilityConfig(echo_window=8)) is None


def test_template_collapse_near_chance_with_high_entropy() -> None:
    collapsed = metrics(7, retrieval_accuracy=0.125, retrieval_chance=0.125, retrieval_prompts=8,
                        token_entropy=2.5)
    alarm = detect_template_collapse(collapsed)
    assert alarm is not None and alarm.kind == "template_collapse" and alarm.iteration == 7
    assert alarm.evidence["retrieval_accuracy"] == 0.125
    healthy = replace(collapsed, retrieval_accuracy=0.9)
    assert detect_template_collapse(healthy) is None
    low_entropy = replace(collapsed, token_entropy=0.1)  # that is the echo trap's territory
    assert detect_template_collapse(low_entropy) is None
    too_few = replace(collapsed, retrieval_prompts=2, retrieval_chance=0.5, retrieval_accuracy=0.5)
    assert detect_template_collapse(too_few) is None
    assert detect_template_collapse(metrics(1)) is None  # not measured


def test_template_collapse_can_require_a_prior_discriminating_iteration() -> None:
    config = StabilityConfig(collapse_requires_prior_discrimination=True)
    collapsed = metrics(5, retrieval_accuracy=0.125, retrieval_chance=0.125, retrieval_prompts=8)
    assert detect_template_collapse(collapsed, config, history=[collapsed]) is None
    was_good = replace(collapsed, iteration=1, retrieval_accuracy=0.8)
    assert detect_template_collapse(collapsed, config, history=[was_good]) is not None


def test_a_lucky_reading_over_few_prompts_does_not_count_as_discrimination() -> None:
    config = StabilityConfig(collapse_requires_prior_discrimination=True)
    collapsed = metrics(5, retrieval_accuracy=0.0, retrieval_chance=0.25, retrieval_prompts=4)
    # 1.5 of 4 (0.38) is above chance + margin, but an input-blind model does that often:
    # P(at least 1 hit of 4 at chance 1/4) = 0.68.
    lucky = replace(collapsed, iteration=1, retrieval_accuracy=0.38)
    assert detect_template_collapse(collapsed, config, history=[lucky]) is None
    # 3 of 4 is unlikely by luck (p = 0.051 > 0.05 still is not; 4 of 4 is, p = 0.004).
    three = replace(lucky, retrieval_accuracy=0.75)
    assert detect_template_collapse(collapsed, config, history=[three]) is None
    four = replace(lucky, retrieval_accuracy=1.0)
    assert detect_template_collapse(collapsed, config, history=[four]) is not None
    laxer = StabilityConfig(collapse_requires_prior_discrimination=True, discrimination_alpha=0.1)
    assert detect_template_collapse(collapsed, laxer, history=[three]) is not None


@pytest.fixture(scope="module")
def peaked_model() -> PreTrainedModel:
    # A larger init than usual makes a random model's outputs depend clearly on its input.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    model.train(False)
    return model


def sample_responses(model: PreTrainedModel, prompts: list[list[int]]) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    responses = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(6):
                probs = model(input_ids=ids).logits[0, -1].softmax(-1)
                ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)[None]], 1)
            responses.append(ids[0, len(prompt):].tolist())
    return responses


def test_discrimination_on_healthy_and_collapsed_batches(peaked_model: PreTrainedModel) -> None:
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 64, (6,), generator=generator).tolist() for _ in range(8)]
    responses = sample_responses(peaked_model, prompts)
    cpu = torch.device("cpu")
    healthy = retrieval_accuracy(score_cross_input(peaked_model, prompts, responses, device=cpu))
    # Template collapse: every prompt gets the same response.
    same = [responses[0]] * len(prompts)
    collapsed = retrieval_accuracy(score_cross_input(peaked_model, prompts, same, device=cpu))
    assert healthy.accuracy >= 0.75
    assert collapsed.accuracy == collapsed.chance == 0.125
    as_metrics = [metrics(0, retrieval_accuracy=r.accuracy, retrieval_chance=r.chance,
                          retrieval_prompts=r.prompts) for r in (healthy, collapsed)]
    assert detect_template_collapse(as_metrics[0]) is None
    assert detect_template_collapse(as_metrics[1]) is not None
