"""LoRA updates (update.lora): the learner against a hand-written LoRA, adapter checkpoints,
their ids, and the refusals of a LoRA configuration that does not fit."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from learning_loop.batch import TrainingSample
from learning_loop.checkpoints import CheckpointError, CheckpointRef, saved_weights_digest
from learning_loop.iteration import load_learner, load_model, save_servable, train_iteration
from learning_loop.lora import AdapterModel, LoraConfigError, linear_module_names, wrap_lora
from learning_loop.objective import policy_action_logprobs
from learning_loop.tiny_model import create_tiny_model
from learning_loop.trajectory_reader import StoredStep, StoredTrajectory, to_rollout_data
from learning_loop.update import UpdateSettings, build_optimizer, update_policy
from triloop.run_config import (
    LoraConfig,
    ObjectiveConfig,
    RunConfig,
    RunConfigError,
    UpdateConfig,
    run_config_from_data,
)
from triloop.weights import adapter_base_id, checkpoint_digest, verify_weights

torch.set_num_threads(1)
CPU = torch.device("cpu")
LORA = LoraConfig(rank=2, alpha=6.0, target_modules=["q_proj", "v_proj", "down_proj"])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CheckpointRef]:
    """The tiny model copied into an artifact store as a root (base) checkpoint."""
    base = create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    artifacts = tmp_path_factory.mktemp("artifacts")
    return artifacts, save_servable(artifacts, load_model(base, CPU), base)


def config(**lora: Any) -> RunConfig:
    return RunConfig.model_validate({
        "name": "unit", "model": {"base": "tiny"},
        "rollout": {"task_ids": ["t"], "group_size": 2, "groups_per_iteration": 2},
        "optimizer": {"learning_rate": 1e-2}, "stability": {"pause_on_alarm": False},
        "schedule": {"iterations": 2, "propose_every": 2},
        "update": {"lora": {"rank": 2, "alpha": 6.0,
                            "target_modules": ["q_proj", "v_proj", "down_proj"], **lora}},
    })


def sample(prompt: list[int], action: list[int], advantage: float, tid: str) -> TrainingSample:
    return TrainingSample(tid, "g", "task", 0, tuple(prompt), tuple(action),
                          (0.0,) * len(action), advantage)


def batch_for(model: torch.nn.Module) -> list[TrainingSample]:
    """Four samples whose behaviour logprobs are the model's own, shifted so some clip."""
    samples = [sample([1, 40, 50], [70, 3], 1.0, "a"), sample([1, 41, 50, 60], [71], -1.0, "b"),
               sample([2, 42], [72, 73, 3], 0.5, "c"), sample([1, 43, 51], [74, 3], -0.5, "d")]
    own = policy_action_logprobs(model, samples, device=CPU)
    shifts = [0.0, 0.3, -0.4, 0.25, 0.0, -0.1, 0.35, 0.0]
    out, k = [], 0
    for s, lps in zip(samples, own, strict=True):
        moved = []
        for lp in lps:
            moved.append(lp + shifts[k % len(shifts)])
            k += 1
        out.append(replace(s, behaviour_logprobs=tuple(moved)))
    return out


class HandLora(torch.nn.Module):
    """W x + (alpha / r) B A x, written out: the frozen linear plus a low-rank update."""

    def __init__(self, linear: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor,
                 scale: float) -> None:
        super().__init__()
        self.linear = linear
        self.a = torch.nn.Parameter(a.clone())
        self.b = torch.nn.Parameter(b.clone())
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.scale * (x @ self.a.T @ self.b.T)


def hand_lora_model(base_dir: Path, learner: torch.nn.Module) -> tuple[torch.nn.Module,
                                                                       dict[str, HandLora]]:
    """A plain copy of the base with each targeted linear replaced by ``HandLora``, holding
    the learner's current A and B."""
    model = load_model(base_dir, CPU)
    for p in model.parameters():
        p.requires_grad_(False)
    adapters = dict(learner.named_modules())
    hands: dict[str, HandLora] = {}
    for name, module in list(model.named_modules()):
        if name.rsplit(".", 1)[-1] not in LORA.target_modules:
            continue
        peft_layer = adapters[f"base_model.model.{name}"]
        a = peft_layer.lora_A["default"].weight.detach()
        b = peft_layer.lora_B["default"].weight.detach()
        hand = HandLora(module, a, b, LORA.alpha / LORA.rank)
        parent_name, child = name.rsplit(".", 1)
        setattr(model.get_submodule(parent_name), child, hand)
        hands[name] = hand
    return model, hands


def hand_grpo_loss(model: torch.nn.Module, samples: list[TrainingSample],
                   objective: ObjectiveConfig) -> torch.Tensor:
    """The clipped GRPO objective, token-aggregated, one sample at a time by hand."""
    total, tokens = torch.zeros(()), 0
    for s in samples:
        ids = torch.tensor([[*s.prompt_token_ids, *s.action_token_ids]])
        logp = model(input_ids=ids).logits[0].float().log_softmax(-1)
        for k, token in enumerate(s.action_token_ids):
            position = len(s.prompt_token_ids) - 1 + k
            ratio = torch.exp(logp[position, token] - s.behaviour_logprobs[k])
            clipped = ratio.clamp(1 - objective.clip_eps_low, 1 + objective.clip_eps_high)
            total = total - torch.minimum(ratio * s.advantage, clipped * s.advantage)
            tokens += 1
    return total / tokens


class GradientRecorder(torch.optim.SGD):
    """Keeps the gradients it is handed and moves nothing (lr 0)."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.0)
        self.seen: list[torch.Tensor] = []

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        self.seen = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]
                     if p.grad is not None]


def test_a_lora_update_has_the_loss_and_gradients_of_a_hand_written_lora(
    root: tuple[Path, CheckpointRef],
) -> None:
    _, base = root
    learner = wrap_lora(load_model(base.path, CPU), LORA, base_id=base.id, seed=3)
    with torch.no_grad():  # B starts at zero; give it values so A's gradient is not zero too
        for name, param in learner.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.2)
    samples = batch_for(learner)
    trainable = [(n, p) for n, p in learner.named_parameters() if p.requires_grad]
    recorder = GradientRecorder([p for _, p in trainable])
    settings = UpdateSettings(update=UpdateConfig(max_grad_norm=1e9, lora=LORA))
    hand, hands = hand_lora_model(base.path, learner)
    metrics = update_policy(learner, recorder, samples, settings, policy_version=0)

    expected = hand_grpo_loss(hand, samples, settings.objective)
    expected.backward()
    assert metrics.clip_fraction > 0  # the shifted logprobs reach the clip on some tokens
    assert metrics.loss == pytest.approx(float(expected), rel=1e-5, abs=1e-6)
    got = dict(zip([n for n, _ in trainable], recorder.seen, strict=True))
    assert len(got) == 2 * len(hands)
    for name, module in hands.items():
        for part, hand_param in (("lora_A", module.a), ("lora_B", module.b)):
            mine = got[f"base_model.model.{name}.{part}.default.weight"]
            assert hand_param.grad is not None and hand_param.grad.abs().sum() > 0
            assert torch.allclose(mine, hand_param.grad, rtol=1e-4, atol=1e-6), (name, part)


def test_the_optimizer_holds_only_the_adapter_parameters(
    root: tuple[Path, CheckpointRef],
) -> None:
    _, base = root
    model, optimizer, _ = load_learner(base.path, config(), CPU, resume_optimizer=False,
                                       base=base)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in held}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    every_lora = {n for n, _ in model.named_parameters() if ".lora_" in n}
    assert names == every_lora
    assert sum(p.numel() for n, p in model.named_parameters() if id(p) in held) < sum(
        p.numel() for p in model.parameters()) / 5


def test_build_optimizer_over_a_lora_model_skips_the_frozen_base(
    root: tuple[Path, CheckpointRef],
) -> None:
    _, base = root
    learner = wrap_lora(load_model(base.path, CPU), LORA, base_id=base.id, seed=0)
    optimizer, _ = build_optimizer(learner, config().optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    assert params and all(p.requires_grad for p in params)
    assert not any(p is q for p in params for n, q in learner.named_parameters()
                   if ".lora_" not in n)


def batch(model: torch.nn.Module, rewards: list[float], version: int = 0
          ) -> list[StoredTrajectory]:
    """Two groups of two one-turn episodes with behaviour logprobs from ``model``."""
    out = []
    for index, reward in enumerate(rewards):
        prompt, action = [1, 40 + index % 2, 50, 60 + index % 2], [70 + index, 3]
        one = TrainingSample("", "", "", 0, tuple(prompt), tuple(action), (0.0, 0.0), 0.0)
        logprobs = policy_action_logprobs(model, [one], device=CPU)[0]
        step = StoredStep(0, prompt, action, [0] * 4 + [1] * 2, logprobs, reward)
        out.append(StoredTrajectory(f"e{index}", f"g{index // 2}", "t", version, reward, [step]))
    return out


def lora_iteration(artifacts: Path, base: CheckpointRef, parent: CheckpointRef, iteration: int,
                   run: RunConfig | None = None) -> Any:
    run = run or config()
    model, _, _ = load_learner(parent.path, run, CPU, resume_optimizer=False, base=base)
    rewards = [1.0, 0.0, 0.5, -0.5] if iteration == 1 else [0.0, 1.0, 1.0, 0.0]
    return train_iteration(
        artifact_dir=artifacts, parent=parent, resume_optimizer=iteration > 1,
        reference_dir=base.path, config=run,
        data=to_rollout_data(batch(model, rewards, iteration - 1)), iteration=iteration,
        history=[], data_cursor={"iteration": iteration}, base=base)


def test_lora_iterations_save_adapter_checkpoints_on_the_base_and_resume(
    tmp_path: Path, root: tuple[Path, CheckpointRef],
) -> None:
    _, base = root
    artifacts = tmp_path / "artifacts"
    first = lora_iteration(artifacts, base, base, 1)
    child = first.checkpoint
    assert first.weights_changed and child.id != base.id
    names = {p.name for p in child.path.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "config.json",
            "tokenizer.json", "trainer_state.pt"} <= names
    assert "model.safetensors" not in names and "README.md" not in names
    assert checkpoint_digest(child.path) == child.id == saved_weights_digest(child.path)
    assert adapter_base_id(child.path) == base.id
    verify_weights(child.path, child.id)
    state = torch.load(child.path / "trainer_state.pt", weights_only=True)
    adapter_tensors = len(LORA.target_modules) * 2 * 2  # modules x layers x (A, B)
    assert len(state["optimizer"]["state"]) == adapter_tensors
    assert {int(s["step"]) for s in state["optimizer"]["state"].values()} == {1}

    # Resume from the adapter checkpoint: its optimizer state continues (step 2), from disk.
    second = lora_iteration(artifacts, base, child, 2)
    assert second.weights_changed and adapter_base_id(second.checkpoint.path) == base.id
    state = torch.load(second.checkpoint.path / "trainer_state.pt", weights_only=True)
    assert {int(s["step"]) for s in state["optimizer"]["state"].values()} == {2}
    # The base's weights were not touched: it still hashes to its id.
    assert saved_weights_digest(base.path) == base.id


def test_the_kl_reference_of_a_lora_update_is_the_base(
    tmp_path: Path, root: tuple[Path, CheckpointRef],
) -> None:
    _, base = root
    run = config().model_copy(update={"objective": ObjectiveConfig(kl_coef=0.1)})
    first = lora_iteration(tmp_path / "a", base, base, 1, run)
    # Fresh adapters (B = 0) are the base: the KL to the reference starts at zero.
    assert first.step_columns["kl"] == pytest.approx(0.0, abs=1e-9)
    second = lora_iteration(tmp_path / "a", base, first.checkpoint, 2, run)
    assert second.step_columns["kl"] > 0


def save_adapter(artifacts: Path, learner: Any, base: CheckpointRef) -> CheckpointRef:
    from learning_loop.checkpoints import save_checkpoint

    return save_checkpoint(artifacts, AdapterModel(learner, base.path))


def trained_adapter(base: CheckpointRef, *, alpha: float = 6.0) -> Any:
    learner = wrap_lora(load_model(base.path, CPU), LORA.model_copy(update={"alpha": alpha}),
                        base_id=base.id, seed=5)
    with torch.no_grad():
        for name, param in learner.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.linspace(-0.1, 0.1, param.numel()).reshape(param.shape))
    return learner


def test_an_adapter_id_names_its_base_and_not_how_it_was_saved(
    tmp_path: Path, root: tuple[Path, CheckpointRef],
) -> None:
    _, base = root
    saved = save_adapter(tmp_path / "one", trained_adapter(base), base)
    again = save_adapter(tmp_path / "two", trained_adapter(base), base)
    assert saved.id == again.id  # re-saved: the same id
    # Rewriting the config's bookkeeping (key order, peft version, mode) keeps the id too.
    path = again.path / "adapter_config.json"
    data = json.loads(path.read_text())
    data.update(peft_version="0.0.0", inference_mode=not data.get("inference_mode"))
    path.write_text(json.dumps(dict(reversed(list(data.items())))))
    assert checkpoint_digest(again.path) == saved.id

    # The same adapter weights on another base are another checkpoint.
    other_dir = create_tiny_model(tmp_path / "other-tiny", seed=1)
    other = save_servable(tmp_path / "other", load_model(other_dir, CPU), other_dir)
    assert other.id != base.id
    on_other = save_adapter(tmp_path / "three", trained_adapter(other), other)
    from safetensors.torch import load_file
    assert all(torch.equal(a, b) for a, b in zip(
        load_file(str(saved.path / "adapter_model.safetensors")).values(),
        load_file(str(on_other.path / "adapter_model.safetensors")).values(), strict=True))
    assert on_other.id != saved.id
    # ...and so is the same adapter scaled differently (alpha is part of what it computes).
    assert save_adapter(tmp_path / "four", trained_adapter(base, alpha=3.0), base).id != saved.id
    # Changed adapter weights are refused by the verifier under the old id.
    tampered = tmp_path / "tampered"
    shutil.copytree(saved.path, tampered)
    tensors = load_file(str(tampered / "adapter_model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0
    from safetensors.torch import save_file
    save_file(tensors, str(tampered / "adapter_model.safetensors"))
    from triloop.weights import WeightsIntegrityError
    with pytest.raises(WeightsIntegrityError, match="hash to"):
        verify_weights(tampered, saved.id)


def test_a_target_module_the_model_lacks_is_refused_with_the_names_it_has(
    root: tuple[Path, CheckpointRef],
) -> None:
    _, base = root
    run = config(target_modules=["q_proj", "query_key_value"])
    with pytest.raises(LoraConfigError, match=r"query_key_value.*linear layers are \[.*q_proj"):
        load_learner(base.path, run, CPU, resume_optimizer=False, base=base)
    assert "o_proj" in linear_module_names(load_model(base.path, CPU))


@pytest.mark.parametrize(("lora", "problem"), [
    ({"rank": 0, "alpha": 8, "target_modules": ["q_proj"]}, "update.lora.rank"),
    ({"rank": 4, "alpha": 0, "target_modules": ["q_proj"]}, "update.lora.alpha"),
    ({"rank": 4, "alpha": 8, "dropout": 1.0, "target_modules": ["q_proj"]},
     "update.lora.dropout"),
    ({"rank": 4, "alpha": 8, "target_modules": []}, "update.lora.target_modules"),
    ({"rank": 4, "alpha": 8, "target_modules": ["q_proj", "q_proj"]}, "more than once"),
    ({"rank": 4, "alpha": 8, "target_modules": ["q proj"]}, "update.lora.target_modules[0]"),
    ({"rank": 4, "alpha": 8, "target_modules": ["q_proj"], "scale": 2},
     "update.lora.scale"),
    ({"rank": 4, "target_modules": ["q_proj"]}, "update.lora.alpha"),
])
def test_bad_lora_settings_are_refused_with_their_path(lora: dict[str, Any],
                                                       problem: str) -> None:
    data = {"name": "x", "model": {"base": "b"}, "rollout": {"task_ids": ["t"]},
            "update": {"lora": lora}}
    with pytest.raises(RunConfigError, match=re.escape(problem)):
        run_config_from_data(data)


def test_lora_on_several_ranks_is_refused() -> None:
    data = {"name": "x", "model": {"base": "b"},
            "rollout": {"task_ids": ["t"], "group_size": 4, "groups_per_iteration": 2},
            "update": {"world_size": 2,
                       "lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj"]}}}
    with pytest.raises(RunConfigError, match=r"update\.lora: a LoRA update runs on one rank"):
        run_config_from_data(data)


def test_an_adapter_is_continued_only_with_its_own_settings_and_base(
    tmp_path: Path, root: tuple[Path, CheckpointRef],
) -> None:
    _, base = root
    child = lora_iteration(tmp_path / "a", base, base, 1).checkpoint
    with pytest.raises(LoraConfigError, match="update.lora asks for"):
        load_learner(child.path, config(rank=4), CPU, resume_optimizer=True, base=base)
    other_dir = create_tiny_model(tmp_path / "other-tiny", seed=1)
    other = save_servable(tmp_path / "other", load_model(other_dir, CPU), other_dir)
    with pytest.raises(LoraConfigError, match="is an adapter on base"):
        load_learner(child.path, config(), CPU, resume_optimizer=True, base=other)
    # A LoRA run's first parent must be its base, not other full weights.
    with pytest.raises(LoraConfigError, match="not the run's base"):
        load_learner(other.path, config(), CPU, resume_optimizer=False, base=base)
    # Full fine-tuning cannot silently read an adapter as full weights.
    with pytest.raises(CheckpointError, match="is a LoRA adapter"):
        load_model(child.path, CPU)


def test_the_adapter_served_by_the_torch_backend_gives_the_learners_logprobs(
    tmp_path: Path, root: tuple[Path, CheckpointRef],
) -> None:
    from execution_loop.inference.torch_backend import TorchPolicyClient, teacher_forced_logprobs

    _, base = root
    child = lora_iteration(tmp_path / "a", base, base, 1).checkpoint
    learner, _, _ = load_learner(child.path, config(), CPU, resume_optimizer=True, base=base)
    prompt = [1, 40, 50, 60]
    with pytest.raises(ValueError, match="needs the directory of its base"):
        TorchPolicyClient(child.path, device="cpu", checkpoint_id=child.id)
    client = TorchPolicyClient(child.path, device="cpu", checkpoint_id=child.id,
                               base_dir=base.path)
    twin = TorchPolicyClient(child.path, device="cpu", checkpoint_id="twin", base_dir=base.path)
    try:
        assert client.base is twin.base  # one copy of the base for both
        sampled = client.sample(prompt, max_new_tokens=6, temperature=1.0, seed=11,
                                ignore_eos=True)
        one = TrainingSample("", "", "", 0, tuple(prompt), tuple(sampled.token_ids),
                             (0.0,) * len(sampled.token_ids), 0.0)
        learned = policy_action_logprobs(learner, [one], device=CPU)[0]
        assert learned == pytest.approx(sampled.logprobs, abs=1e-4)
        assert teacher_forced_logprobs(client.model, prompt, sampled.token_ids) == pytest.approx(
            learned, abs=1e-4)
        base_only = load_model(base.path, CPU)
        assert policy_action_logprobs(base_only, [one], device=CPU)[0] != pytest.approx(
            learned, abs=1e-4)  # the adapter is applied, not just the base
        assert client.tokenizer().decode([70]) == twin.tokenizer().decode([70])
    finally:
        client.close()
        twin.close()
