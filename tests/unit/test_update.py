"""update_policy on a tiny Qwen2: masking, micro-batching, off-policy guard, clipping, KL."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from learning_loop.batch import InvalidSampleError, TrainingSample, collate
from learning_loop.objective import ObjectiveInputError, policy_action_logprobs
from learning_loop.update import UpdateError, UpdateSettings, build_optimizer, update_policy
from triloop.run_config import ObjectiveConfig, OptimizerConfig, UpdateConfig

CPU = torch.device("cpu")


def tiny_model(seed: int = 0) -> PreTrainedModel:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    return model


def sample(prompt: list[int], action: list[int], advantage: float, version: int = 0,
           logprobs: list[float] | None = None, tid: str = "t") -> TrainingSample:
    return TrainingSample(tid, "g", "task", version, tuple(prompt), tuple(action),
                          tuple(logprobs or [-4.0] * len(action)), advantage)


def on_policy(model: PreTrainedModel, samples: list[TrainingSample]) -> list[TrainingSample]:
    """The same samples with behaviour logprobs equal to the model's own."""
    lps = policy_action_logprobs(model, samples, device=CPU)
    return [replace(s, behaviour_logprobs=tuple(lp)) for s, lp in zip(samples, lps, strict=True)]


def batch_of(model: PreTrainedModel) -> list[TrainingSample]:
    return on_policy(model, [
        sample([1, 2, 3], [4, 5], 1.0, tid="a"),
        sample([1, 2, 3], [6, 7, 8], -1.0, tid="b"),
        sample([9, 10], [11], 0.5, tid="c"),
        sample([12, 13, 14, 15], [16, 17], -0.5, tid="d"),
    ])


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_collate_aligns_actions_with_logits() -> None:
    batch = collate([sample([1, 2, 3], [4, 5], 1.0, logprobs=[-0.1, -0.2]),
                     sample([7], [8], -1.0, logprobs=[-0.3])], pad_token_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # logits at position 2 predict token 4, at 3 predict token 5
    assert batch.action_mask.tolist() == [[0, 0, 1, 1], [1, 0, 0, 0]]
    assert batch.behaviour_logprobs[0].tolist() == pytest.approx([0, 0, -0.1, -0.2])
    assert batch.advantages.tolist() == [1.0, -1.0]
    assert batch.importance_weights.tolist() == [[1.0] * 4] * 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt_token_ids": ()}, "empty prompt"),
        ({"action_token_ids": ()}, "no action tokens"),
        ({"behaviour_logprobs": (-1.0, -1.0)}, "one each"),
        ({"behaviour_logprobs": (0.5,)}, "finite and <= 0"),
    ],
)
def test_invalid_samples_are_refused(kwargs: dict[str, object], match: str) -> None:
    fields = {"trajectory_id": "t", "group_id": "g", "task_id": "x", "policy_version": 0,
              "prompt_token_ids": (1,), "action_token_ids": (2,),
              "behaviour_logprobs": (-1.0,), "advantage": 0.0} | kwargs
    with pytest.raises(InvalidSampleError, match=match):
        TrainingSample(**fields)  # type: ignore[arg-type]


def test_update_steps_and_reports() -> None:
    model = tiny_model()
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(learning_rate=1e-3))
    samples = batch_of(model)
    before = weights(model)
    metrics = update_policy(model, optimizer, samples, UpdateSettings(), policy_version=0,
                            scheduler=scheduler, device=CPU)
    assert metrics.optimizer_steps == 1 and metrics.skipped_steps == 0
    assert metrics.trainable_tokens == 8 and metrics.samples == 4
    assert metrics.total_tokens == 5 + 6 + 3 + 6
    assert metrics.grad_norm is not None and metrics.grad_norm > 0
    # On-policy behaviour logprobs: ratio 1, nothing clipped, no drift.
    assert metrics.clip_fraction == 0.0 and metrics.approx_kl == pytest.approx(0.0, abs=1e-6)
    assert 3.0 < metrics.entropy < 4.2  # near log(64) = 4.16 for a fresh model
    assert metrics.device == "cpu" and metrics.off_policy.stale_dropped == 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    off_policy = metrics.as_dict()["off_policy"]
    assert isinstance(off_policy, dict) and off_policy["stale_policy"] == "drop"


def test_gradient_is_that_of_the_action_tokens_alone() -> None:
    # With SGD(lr=1) and no clipping the weight change is minus the gradient, which must equal
    # the gradient of -A * mean log p(action token | context) computed by hand.
    model = tiny_model()
    expected = copy.deepcopy(model)
    samples = on_policy(model, [sample([1, 2, 3], [4, 5], 0.7), sample([6], [7], -0.3)])
    logits = expected(input_ids=torch.tensor([[1, 2, 3, 4, 5]])).logits[0].log_softmax(-1)
    short = expected(input_ids=torch.tensor([[6, 7]])).logits[0].log_softmax(-1)
    by_hand = -(0.7 * (logits[2, 4] + logits[3, 5]) - 0.3 * short[0, 7]) / 3
    by_hand.backward()
    before = weights(model)
    settings = UpdateSettings(update=UpdateConfig(max_grad_norm=1e9))
    update_policy(model, torch.optim.SGD(model.parameters(), lr=1.0), samples, settings,
                  policy_version=0)
    for name, param in expected.named_parameters():
        assert param.grad is not None
        delta = before[name] - model.state_dict()[name]
        assert torch.allclose(delta, param.grad, atol=1e-6), name


class GradientRecorder(torch.optim.SGD):
    """An optimizer that keeps the gradients it is handed and moves nothing (lr 0)."""

    def __init__(self, params: object) -> None:
        super().__init__(params, lr=0.0)  # type: ignore[arg-type]
        self.seen: list[torch.Tensor] = []

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        self.seen = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]
                     if p.grad is not None]


def test_micro_batches_give_the_full_batch_update() -> None:
    # What micro-batching must preserve is the accumulated gradient before the optimizer
    # step: the same float32 terms summed in another order. Weights after an adaptive step
    # (AdamW's first step is about lr * sign(g)) are not comparable: a gradient element
    # near 0 can change sign under rounding and move its weight by 2 * lr.
    gradients, norms = [], []
    for micro in (1, 4):
        model = tiny_model()
        recorder = GradientRecorder(model.parameters())
        settings = UpdateSettings(update=UpdateConfig(micro_batch_size=micro, max_grad_norm=1e9))
        metrics = update_policy(model, recorder, batch_of(model), settings, policy_version=0)
        gradients.append(recorder.seen)
        norms.append(metrics.grad_norm)
    one, four = gradients
    assert len(one) == len(four) > 0
    # Reordering a sum of n float32 terms changes it by at most about n * eps * sum|terms|;
    # n = 4 samples here, eps = 1.2e-7, so 1e-5 of the largest gradient is a loose bound
    # that still catches a wrong normaliser (off by a factor of 2 or more).
    scale = max(float(g.abs().max()) for g in one)
    for g1, g4 in zip(one, four, strict=True):
        torch.testing.assert_close(g1, g4, rtol=1e-5, atol=1e-5 * scale)
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)


def test_updates_move_probability_toward_positive_advantage() -> None:
    model = tiny_model()
    optimizer, _ = build_optimizer(model, OptimizerConfig(learning_rate=3e-3))
    good, bad = sample([1, 2, 3], [4, 5], 1.0), sample([1, 2, 3], [6, 7], -1.0)
    before = [sum(lp) for lp in policy_action_logprobs(model, [good, bad], device=CPU)]
    for _ in range(5):
        update_policy(model, optimizer, on_policy(model, [good, bad]), UpdateSettings(),
                      policy_version=0)
    after = [sum(lp) for lp in policy_action_logprobs(model, [good, bad], device=CPU)]
    assert after[0] > before[0] + 0.5 and after[1] < before[1] - 0.5


def test_zero_advantage_changes_nothing() -> None:
    model = tiny_model()
    optimizer, _ = build_optimizer(model, OptimizerConfig(learning_rate=1e-2))
    before = weights(model)
    samples = [replace(s, advantage=0.0) for s in batch_of(model)]
    metrics = update_policy(model, optimizer, samples, UpdateSettings(), policy_version=0)
    assert metrics.loss == 0.0 and metrics.grad_norm == 0.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_stale_samples_are_dropped_and_reported() -> None:
    model = tiny_model()
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    samples = batch_of(model)
    samples[0] = replace(samples[0], policy_version=1)  # 4 versions old at version 5
    samples = [replace(s, policy_version=4) for s in samples[1:]] + samples[:1]
    settings = UpdateSettings(update=UpdateConfig(max_staleness=2, stale_samples="drop"))
    metrics = update_policy(model, optimizer, samples, settings, policy_version=5)
    assert metrics.off_policy.stale_dropped == 1 and metrics.samples == 3
    assert metrics.off_policy.max_staleness_seen == 4


def test_all_samples_stale_means_no_step() -> None:
    model = tiny_model()
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    before = weights(model)
    metrics = update_policy(model, optimizer, batch_of(model), UpdateSettings(), policy_version=9)
    assert metrics.samples == 0 and metrics.optimizer_steps == 0 and metrics.grad_norm is None
    assert metrics.off_policy.stale_dropped == 4
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_stale_samples_can_be_importance_corrected() -> None:
    model = tiny_model()
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    # Behaviour logprobs far below the current policy's: weights exp(prox - behav) hit the cap.
    samples = [sample([1, 2, 3], [4, 5], 1.0, logprobs=[-30.0, -30.0]),
               *on_policy(model, [sample([9, 10], [11], -1.0)])]
    settings = UpdateSettings(update=UpdateConfig(
        max_staleness=0, stale_samples="importance_correct", importance_weight_cap=2.0))
    metrics = update_policy(model, optimizer, samples, settings, policy_version=1)
    report = metrics.off_policy
    assert report.stale_corrected == 2 and report.stale_dropped == 0 and metrics.samples == 2
    assert report.truncated_weight_share == pytest.approx(2 / 3)
    # Clipping is against the current policy, so nothing is clipped on the first step.
    assert metrics.clip_fraction == 0.0
    assert report.mean_importance_weight is not None and 1.0 < report.mean_importance_weight <= 2


def test_samples_from_a_newer_policy_are_refused() -> None:
    model = tiny_model()
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    with pytest.raises(UpdateError, match="newer than"):
        update_policy(model, optimizer, [sample([1], [2], 1.0, version=3)], UpdateSettings(),
                      policy_version=2)


def test_model_on_another_device_is_refused() -> None:
    model = tiny_model()
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    with pytest.raises(UpdateError, match="move it"):
        update_policy(model, optimizer, [sample([1], [2], 1.0)], UpdateSettings(),
                      policy_version=0, device=torch.device("meta"))


def test_non_finite_gradient_skips_the_step() -> None:
    model = tiny_model()
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    before = weights(model)
    model.lm_head.weight.register_hook(lambda g: g * float("inf"))
    metrics = update_policy(model, optimizer, batch_of(model), UpdateSettings(), policy_version=0)
    assert metrics.skipped_steps == 1 and metrics.optimizer_steps == 0
    assert metrics.grad_norm is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_gradient_norm_is_reported_before_clipping() -> None:
    model = tiny_model()
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    settings = UpdateSettings(update=UpdateConfig(max_grad_norm=1e-6))
    metrics = update_policy(model, optimizer, batch_of(model), settings, policy_version=0)
    assert metrics.grad_norm is not None and metrics.grad_norm > 1e-3


def test_several_optimizer_steps_per_batch() -> None:
    model = tiny_model()
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(warmup_steps=4))
    settings = UpdateSettings(update=UpdateConfig(optimizer_steps_per_batch=2))
    metrics = update_policy(model, optimizer, batch_of(model), settings, policy_version=0,
                            scheduler=scheduler)
    assert metrics.optimizer_steps == 2
    assert metrics.learning_rate == pytest.approx(1e-5 * 3 / 4)  # warm-up step 3 of 4


def test_reference_kl_is_measured_and_required_when_weighted() -> None:
    model = tiny_model()
    reference = copy.deepcopy(model).requires_grad_(False)
    optimizer, _ = build_optimizer(model, OptimizerConfig())
    settings = UpdateSettings(objective=ObjectiveConfig(kl_coef=0.1, aggregation="sequence"))
    metrics = update_policy(model, optimizer, batch_of(model), settings, policy_version=0,
                            reference=reference)
    assert metrics.reference_kl == pytest.approx(0.0, abs=1e-6)  # first step: same weights
    with pytest.raises(ObjectiveInputError, match="reference"):
        update_policy(model, optimizer, batch_of(model), settings, policy_version=0)


def test_on_policy_ratios_are_one_at_the_sampling_temperature() -> None:
    from execution_loop.inference.torch_backend import teacher_forced_logprobs

    model = tiny_model()
    # Behaviour logprobs as the execution loop's sampler reports them at T = 0.7.
    raw = [sample([1, 2, 3], [4, 5], 1.0, tid="a"), sample([1, 2, 3], [6, 7, 8], -1.0, tid="b"),
           sample([9, 10], [11], 0.5, tid="c"), sample([12, 13, 14, 15], [16, 17], -0.5, tid="d")]
    at_t = [replace(s, behaviour_logprobs=tuple(teacher_forced_logprobs(
        model, s.prompt_token_ids, s.action_token_ids, temperature=0.7))) for s in raw]
    learner = policy_action_logprobs(model, at_t, device=CPU, temperature=0.7)
    untempered = policy_action_logprobs(model, at_t, device=CPU)
    flat = [b for s in at_t for b in s.behaviour_logprobs]
    # Full forward against the sampler's incremental one: equal up to float32 rounding.
    assert [x for row in learner for x in row] == pytest.approx(flat, abs=1e-4)
    assert max(abs(a - b) for a, b in zip([x for r in untempered for x in r], flat,
                                          strict=True)) > 1e-2  # what the learner used to see
    settings = UpdateSettings(temperature=0.7, update=UpdateConfig(max_grad_norm=1e9))
    metrics = update_policy(model, GradientRecorder(model.parameters()), at_t, settings,
                            policy_version=0)
    assert metrics.clip_fraction == 0.0 and metrics.approx_kl == pytest.approx(0.0, abs=1e-6)


def test_update_settings_take_the_rollout_temperature() -> None:
    from triloop.run_config import RunConfig

    run = RunConfig.model_validate({"name": "t", "model": {"base": "x"}, "rollout": {
        "task_ids": ["t"], "temperature": 0.7}})
    assert UpdateSettings.from_run(run).temperature == 0.7
