"""bf16 autocast and activation checkpointing of the policy update: applied, and close."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learning_loop.batch import TrainingSample
from learning_loop.iteration import load_model
from learning_loop.objective import policy_action_logprobs
from learning_loop.tiny_model import TinyModelSpec, create_tiny_model
from learning_loop.update import UpdateError, UpdateSettings, build_optimizer, update_policy
from learning_loop.update_options import (
    UpdateOptionError,
    apply_update_options,
    check_bf16,
    enable_activation_checkpointing,
    enable_bf16_autocast,
)
from triloop.run_config import OptimizerConfig, UpdateConfig

torch.set_num_threads(1)
CPU = torch.device("cpu")
EPS32 = torch.finfo(torch.float32).eps
EPS_BF16 = torch.finfo(torch.bfloat16).eps  # 2**-7: bf16 keeps 8 significant bits


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def samples(model: torch.nn.Module) -> list[TrainingSample]:
    out = []
    for i in range(6):
        prompt = (1, *(10 + (i * 5 + k) % 40 for k in range(3 + i % 3)))
        action = tuple(30 + (i + k) % 20 for k in range(2 + i % 2))
        draft = TrainingSample(f"e{i}", "g", "t", 0, prompt, action, (0.0,) * len(action), 0.0)
        logprobs = tuple(policy_action_logprobs(model, [draft], device=CPU)[0])
        out.append(TrainingSample(f"e{i}", "g", "t", 0, prompt, action, logprobs,
                                  1.0 if i % 2 else -1.0))
    return out


def batch_inputs() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[1, 12, 17, 22, 30, 31], [1, 40, 41, 42, 43, 44]])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_bf16_autocast_runs_the_forward_in_bf16_and_stays_close(model_dir: Path) -> None:
    plain, autocast = load_model(model_dir, CPU), load_model(model_dir, CPU)
    enable_bf16_autocast(autocast, CPU)
    seen: list[torch.dtype] = []
    layer = autocast.model.layers[0].mlp.up_proj  # type: ignore[union-attr]
    layer.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    with torch.no_grad():
        expected = plain(**batch_inputs()).logits
        got = autocast(**batch_inputs()).logits
    assert seen == [torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in autocast.parameters())  # fp32 master weights
    # bf16 rounds each matmul input to 8 significant bits: relative error about eps_bf16
    # per rounding, a few roundings deep (embedding, attention, MLP, head per layer), on
    # logits of magnitude up to max |logit|.
    depth = 4 * TinyModelSpec().num_hidden_layers + 2
    bound = depth * EPS_BF16 * float(expected.abs().max())
    assert float((got.float() - expected).abs().max()) <= bound


def test_a_bf16_update_stays_close_to_the_fp32_one(model_dir: Path) -> None:
    results = {}
    for bf16 in (False, True):
        model = load_model(model_dir, CPU)
        batch = samples(model)
        apply_update_options(UpdateConfig(bf16_autocast=bf16), CPU, model, None)
        optimizer, _ = build_optimizer(model, OptimizerConfig(learning_rate=1e-3))
        metrics = update_policy(model, optimizer, batch,
                                UpdateSettings(update=UpdateConfig(micro_batch_size=2)),
                                policy_version=0, device=CPU)
        results[bf16] = metrics
    fp32, bf16 = results[False], results[True]
    assert bf16.trainable_tokens == fp32.trainable_tokens
    assert bf16.grad_norm is not None and fp32.grad_norm is not None
    # On-policy samples: the fp32 ratio is 1 and the loss is -mean(A); under bf16 the
    # logprobs move by the logits' rounding (see above), the ratio by as much.
    assert abs(bf16.loss - fp32.loss) <= 0.1 * abs(fp32.loss) + 0.05
    assert bf16.grad_norm == pytest.approx(fp32.grad_norm, rel=0.2)


def test_checkpointing_recomputes_each_layer_and_keeps_the_gradient(model_dir: Path) -> None:
    grads, calls = {}, {}
    for checkpointed in (False, True):
        model = load_model(model_dir, CPU)
        model.eval()  # the update's mode: Hugging Face's own switch would do nothing here
        if checkpointed:
            assert enable_activation_checkpointing(model) == TinyModelSpec().num_hidden_layers
        count = [0]
        # The layer's first module: the recomputation starts there (and may stop early,
        # once it has rebuilt every tensor the backward still needs).
        first = model.model.layers[0].input_layernorm  # type: ignore[union-attr]
        first.register_forward_hook(lambda *_, c=count: c.__setitem__(0, c[0] + 1))
        model(**batch_inputs()).logits.float().logsumexp(-1).sum().backward()
        calls[checkpointed] = count[0]
        grads[checkpointed] = {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.grad is not None}
    assert calls == {False: 1, True: 2}  # the backward ran the layer's forward again
    assert grads[True].keys() == grads[False].keys()
    for name, grad in grads[True].items():
        # The recomputation repeats the same operations on the same inputs: equal up to
        # a few float32 roundings of each element.
        reference = grads[False][name]
        assert bool(((grad - reference).abs() <= 8 * EPS32 * reference.abs() + 1e-12).all())


def test_checkpointing_is_skipped_without_gradients(model_dir: Path) -> None:
    model = load_model(model_dir, CPU)
    enable_activation_checkpointing(model)
    with torch.no_grad():
        out = model(**batch_inputs(), use_cache=True)
    assert out.past_key_values is not None  # generation keeps its cache


def test_bf16_is_refused_on_a_gpu_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(UpdateOptionError, match="no bf16 support"):
        check_bf16(torch.device("cuda"))
    assert issubclass(UpdateOptionError, UpdateError)  # the activity: non-retryable
    with pytest.raises(UpdateOptionError, match="not meta"):
        check_bf16(torch.device("meta"))
    check_bf16(CPU)  # emulated where the CPU lacks bf16 instructions: allowed


def test_checkpointing_is_refused_for_a_model_without_decoder_layers() -> None:
    with pytest.raises(UpdateOptionError, match="no decoder layers"):
        enable_activation_checkpointing(torch.nn.Sequential(torch.nn.Linear(2, 2)))
