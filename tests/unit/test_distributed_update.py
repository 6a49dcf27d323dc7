"""A multi-rank policy update (torchrun, gloo on CPU) against the in-process one.

The launches start real ranks (``python -m torch.distributed.run``) on the loopback
interface; each takes one to two minutes on a loaded two-core machine, so there are four:
the same update as one process, a failing rank, a whole iteration, and the time limit.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from learning_loop.batch import TrainingSample
from learning_loop.checkpoints import CheckpointRef, saved_weights_digest
from learning_loop.data_parallel import RankGroup
from learning_loop.iteration import (
    load_learner,
    load_model,
    save_servable,
    train_iteration,
)
from learning_loop.iteration_records import saved_iteration
from learning_loop.objective import policy_action_logprobs
from learning_loop.rank_launch import RankFailed, RankJob, resolve_backend, run_ranks
from learning_loop.tiny_model import TinyModelSpec, create_tiny_model
from learning_loop.trajectory_reader import StoredStep, StoredTrajectory, to_rollout_data
from learning_loop.update import UpdateError, UpdateSettings, update_policy
from triloop.run_config import RunConfig, RunConfigError, run_config_from_data

torch.set_num_threads(1)
CPU = torch.device("cpu")
EPS32 = torch.finfo(torch.float32).eps
LEARNING_RATE = 1e-3


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CheckpointRef]:
    base = create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    artifacts = tmp_path_factory.mktemp("artifacts")
    return artifacts, save_servable(artifacts, load_model(base, CPU), base)


def run_config(world_size: int, **update: object) -> RunConfig:
    return RunConfig.model_validate({
        "name": "ranks", "model": {"base": "tiny"},
        "rollout": {"task_ids": ["t"], "group_size": 4, "groups_per_iteration": 2},
        # adam_eps 1: the first AdamW step is lr * g / (|g| + 1), smooth in g with slope at
        # most lr, so a gradient's rounding error reaches the weights at most lr times over
        # (with the default eps the step is about lr * sign(g): a near-zero gradient's
        # rounding could flip a whole step and no rounding-sized tolerance would hold).
        "optimizer": {"learning_rate": LEARNING_RATE, "adam_eps": 1.0},
        "stability": {"pause_on_alarm": False},
        "update": {"world_size": world_size, "micro_batch_size": 2, "max_grad_norm": 1e6,
                   **update},
    })


def samples_for(parent: Path) -> list[TrainingSample]:
    """Eight samples of different lengths, on-policy (ratios 1, away from the clip)."""
    model = load_model(parent, CPU)
    out = []
    for i in range(8):
        prompt = (1, *(10 + (i * 7 + k) % 50 for k in range(3 + i % 4)))
        action = tuple(20 + (i * 3 + k) % 40 for k in range(2 + i % 3))
        draft = TrainingSample(f"e{i}", f"g{i // 4}", "t", 0, prompt, action,
                               (0.0,) * len(action), 0.0)
        logprobs = tuple(policy_action_logprobs(model, [draft], device=CPU)[0])
        out.append(TrainingSample(f"e{i}", f"g{i // 4}", "t", 0, prompt, action, logprobs,
                                  1.0 if i % 3 else -1.5))
    return out


class _GradientRecorder(torch.optim.SGD):
    """Keeps the gradient it was asked to step on, and steps by nothing."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        super().__init__(params, lr=0.0)
        self.grads: list[torch.Tensor] = []

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        self.grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                      for group in self.param_groups for p in group["params"]]


def gradient_magnitudes(parent: Path, samples: list[TrainingSample]) -> dict[str, torch.Tensor]:
    """Elementwise sum over samples of |that sample's term of the batch gradient|."""
    model = load_model(parent, CPU)
    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    total_tokens = sum(len(s.action_token_ids) for s in samples)
    mass = {names[id(p)]: torch.zeros_like(p) for p in params}
    for sample in samples:
        recorder = _GradientRecorder(params)
        update_policy(model, recorder, [sample], UpdateSettings.from_run(run_config(1)),
                      policy_version=0, device=CPU)
        # Alone, a sample's loss is normalised by its own action tokens, in the batch by
        # the batch's: rescale to its term of the batch gradient ("token" aggregation).
        share = len(sample.action_token_ids) / total_tokens
        for p, grad in zip(params, recorder.grads, strict=True):
            mass[names[id(p)]] += grad.abs() * share
    return mass


def test_two_ranks_make_the_update_one_rank_makes(root: tuple[Path, CheckpointRef]) -> None:
    artifacts, parent = root
    samples = samples_for(parent.path)
    one = run_config(1)
    model, optimizer, scheduler = load_learner(parent.path, one, CPU, resume_optimizer=False)
    single = update_policy(model, optimizer, samples, UpdateSettings.from_run(one),
                           policy_version=0, scheduler=scheduler, device=CPU)

    outcome = run_ranks(RankJob(artifacts, parent.path, None, False, run_config(2), samples,
                                0, 0, {"iteration": 1}))

    # Rank 0 saved one complete, content-addressed checkpoint; the metrics cover the batch.
    assert saved_weights_digest(outcome.checkpoint.path) == outcome.checkpoint.id
    assert outcome.metrics.samples == single.samples == 8
    assert outcome.metrics.trainable_tokens == single.trainable_tokens
    assert outcome.metrics.optimizer_steps == 1
    assert outcome.metrics.loss == pytest.approx(single.loss, rel=1e-5)
    # Tolerance from float rounding. The ranks sum the same per-token gradient terms as one
    # process, grouped differently (other micro-batches, a cross-rank sum): regrouping a
    # sum of n float32 terms moves it by at most about n * eps times the sum of the terms'
    # magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., 4.2).
    # n: the batch's tokens, plus the widest inner product behind each term (the MLP
    # width) in each layer's forward and backward. The step turns a gradient error into
    # at most lr times that error (see run_config); writing w - step rounds once more.
    spec = TinyModelSpec()
    n = sum(s.length for s in samples) + 2 * spec.intermediate_size * spec.num_hidden_layers
    mass = gradient_magnitudes(parent.path, samples)
    before = load_model(parent.path, CPU).state_dict()
    after_ranks = load_file(str(outcome.checkpoint.path / "model.safetensors"))
    after_one = model.state_dict()
    for name, weights in after_ranks.items():
        tolerance = LEARNING_RATE * n * EPS32 * mass[name] + 2 * EPS32 * weights.abs()
        difference = (weights - after_one[name]).abs()
        assert bool((difference <= tolerance).all()), (
            f"{name}: {float((difference - tolerance).max()):.3e} beyond tolerance")
    # ... and the comparison can fail: the update moved the weights far more than that.
    moved = max(float((after_one[k] - before[k]).abs().max()) for k in after_ranks)
    assert moved > 100 * max(float((LEARNING_RATE * n * EPS32 * m).max()) for m in mass.values())


def test_a_failing_rank_is_named_with_its_log(root: tuple[Path, CheckpointRef]) -> None:
    artifacts, parent = root
    samples = samples_for(parent.path)
    # A token id beyond the vocabulary in the second-longest sample: rank 1's shard.
    longest = sorted(samples, key=lambda s: -s.length)
    bad = longest[1]
    broken = TrainingSample(bad.trajectory_id, bad.group_id, bad.task_id, 0,
                            bad.prompt_token_ids[:-1] + (10**6,), bad.action_token_ids,
                            bad.behaviour_logprobs, bad.advantage)
    samples = [broken if s is bad else s for s in samples]
    before = sorted(p.name for p in (artifacts / "checkpoints").iterdir())

    with pytest.raises(RankFailed) as failed:
        run_ranks(RankJob(artifacts, parent.path, None, False, run_config(2), samples, 0, 0,
                          {"iteration": 1}))

    assert failed.value.rank == 1 and failed.value.python_error
    message = str(failed.value)
    assert message.startswith("rank 1 of 2 failed")
    assert "IndexError" in message and "rank 1 log (tail)" in message
    assert "\", line " in message  # a traceback frame from the rank's own stderr
    # Nothing half-written: no new checkpoint, no staging or working directory left.
    assert sorted(p.name for p in (artifacts / "checkpoints").iterdir()) == before
    assert not list(artifacts.glob(".ranks-*"))


def test_an_iteration_with_two_ranks_saves_one_annotated_checkpoint(
    root: tuple[Path, CheckpointRef], tmp_path: Path,
) -> None:
    _, parent = root
    artifacts = tmp_path / "artifacts"
    model = load_model(parent.path, CPU)
    trajectories = []
    for index, reward in enumerate([1.0, 0.0, 0.5, -0.5, 1.0, 0.2, 0.0, 0.7]):
        prompt, action = [1, 40 + index % 3, 50, 60 + index % 2], [70 + index, 3]
        draft = TrainingSample("", "", "", 0, tuple(prompt), tuple(action), (0.0, 0.0), 0.0)
        logprobs = policy_action_logprobs(model, [draft], device=CPU)[0]
        step = StoredStep(0, prompt, action, [0] * 4 + [1] * 2, logprobs, reward)
        trajectories.append(StoredTrajectory(f"e{index}", f"g{index // 4}", "t", 0, reward,
                                             [step]))

    outcome = train_iteration(
        artifact_dir=artifacts, parent=parent, resume_optimizer=False, reference_dir=None,
        config=run_config(2), data=to_rollout_data(trajectories), iteration=1, history=[],
        data_cursor={"run_id": "r", "iteration": 1})

    child = outcome.checkpoint
    assert outcome.weights_changed and child.path.parent == artifacts / "checkpoints"
    assert [p.name for p in (artifacts / "checkpoints").iterdir()] == [child.id]
    assert saved_weights_digest(child.path) == child.id
    assert (child.path / "tokenizer.json").is_file()  # servable like an in-process save
    record = saved_iteration(child.path, run_id="r", iteration=1)
    assert record is not None and record["training_step"] == outcome.step_columns
    assert outcome.step_columns["metrics"]["update"]["samples"] == 8
    assert not list(artifacts.glob(".ranks-*"))


def test_world_size_must_be_positive_and_fit_the_batch() -> None:
    data = run_config(1).model_dump(mode="json")
    for world_size, path in ((0, "update.world_size"), (9, "update.world_size")):
        data["update"]["world_size"] = world_size
        with pytest.raises(RunConfigError) as refused:
            run_config_from_data(data)
        assert [p.path for p in refused.value.problems] == [path]
    data["update"].update(world_size=2, distributed_backend="mpi")
    with pytest.raises(RunConfigError, match="update.distributed_backend"):
        run_config_from_data(data)


def test_nccl_needs_a_gpu_per_rank() -> None:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    config = run_config(2, distributed_backend="nccl").update
    if gpus >= 2:
        assert resolve_backend(config) == "nccl"
        return
    with pytest.raises(UpdateError, match="nccl needs one per rank"):
        resolve_backend(config)
    assert resolve_backend(run_config(2, distributed_backend="gloo").update) == "gloo"


def test_shards_cover_the_batch_once_and_balance_tokens() -> None:
    batch = [TrainingSample(f"e{i}", "g", "t", 0, (1,) * (1 + i), (2,) * (1 + i % 3),
                            (0.0,) * (1 + i % 3), 1.0) for i in range(7)]
    shards = [RankGroup(rank, 3).shard(batch) for rank in range(3)]
    assert sorted(s.trajectory_id for shard in shards for s in shard) == sorted(
        s.trajectory_id for s in batch)
    tokens = [sum(s.length for s in shard) for shard in shards]
    assert max(tokens) - min(tokens) <= max(s.length for s in batch)
    assert RankGroup(0, 1).shard(batch) == sorted(batch, key=lambda s: -s.length)


def test_ranks_out_of_time_are_stopped_and_reported(root: tuple[Path, CheckpointRef]) -> None:
    artifacts, parent = root
    samples = samples_for(parent.path)

    with pytest.raises(RankFailed) as failed:
        run_ranks(RankJob(artifacts, parent.path, None, False,
                          run_config(2, rank_timeout_s=1.0), samples, 0, 0, {}))

    assert not failed.value.python_error  # worth a retry: another attempt may finish
    assert "ran out of update.rank_timeout_s" in str(failed.value)
    assert "torchrun.log (tail)" in str(failed.value)
    # torchrun and its ranks were stopped as a group: nothing of them is left running.
    left = [p for p in psutil.Process().children(recursive=True)
            if any(name in " ".join(p.cmdline())
                   for name in ("torch.distributed.run", "rank_update"))]
    assert left == []
    assert not list(artifacts.glob(".ranks-*"))
