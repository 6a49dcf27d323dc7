"""One learning iteration outside Temporal: child checkpoints, no-signal batches, resume."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from learning_loop.batch import TrainingSample
from learning_loop.checkpoints import CheckpointError, CheckpointRef, saved_weights_digest
from learning_loop.iteration import (
    IterationOutcome,
    WarmLearner,
    load_model,
    save_servable,
    train_iteration,
)
from learning_loop.iteration_records import saved_iteration
from learning_loop.objective import policy_action_logprobs
from learning_loop.tiny_model import create_tiny_model
from learning_loop.trajectory_reader import StoredStep, StoredTrajectory, to_rollout_data
from triloop.run_config import RunConfig

torch.set_num_threads(1)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CheckpointRef]:
    """The tiny model copied into an artifact store as a root checkpoint."""
    base = create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    artifacts = tmp_path_factory.mktemp("artifacts")
    return artifacts, save_servable(artifacts, load_model(base, CPU), base)


def config() -> RunConfig:
    return RunConfig.model_validate({
        "name": "unit", "model": {"base": "tiny"},
        "rollout": {"task_ids": ["t"], "group_size": 2, "groups_per_iteration": 2},
        "optimizer": {"learning_rate": 1e-2}, "stability": {"pause_on_alarm": False},
        "schedule": {"iterations": 2, "propose_every": 2},
    })


def batch(parent: Path, rewards: list[float], version: int = 0) -> list[StoredTrajectory]:
    """Two groups of two one-turn episodes with behaviour logprobs from ``parent``."""
    model = load_model(parent, CPU)
    out = []
    for index, reward in enumerate(rewards):
        prompt, action = [1, 40 + index % 2, 50, 60 + index % 2], [70 + index, 3]
        sample = TrainingSample("", "", "", 0, tuple(prompt), tuple(action), (0.0, 0.0), 0.0)
        logprobs = policy_action_logprobs(model, [sample], device=CPU)[0]
        step = StoredStep(0, prompt, action, [0] * 4 + [1] * 2, logprobs, reward)
        out.append(StoredTrajectory(f"e{index}", f"g{index // 2}", "t", version, reward, [step]))
    return out


def test_an_update_writes_a_servable_child_checkpoint(root: tuple[Path, CheckpointRef]) -> None:
    artifacts, parent = root
    data = to_rollout_data(batch(parent.path, [1.0, 0.0, 0.5, -0.5]))
    outcome = train_iteration(
        artifact_dir=artifacts, parent=parent, resume_optimizer=False, reference_dir=None,
        config=config(), data=data, iteration=1, history=[], data_cursor={"iteration": 1})

    child = outcome.checkpoint
    assert outcome.weights_changed and child.id != parent.id
    assert saved_weights_digest(child.path) == child.id
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in child.path.iterdir()}
    columns = outcome.step_columns
    assert columns["loss"] is not None and columns["trainable_tokens"] == 8
    assert columns["reward_mean"] == pytest.approx(0.25)
    assert saved_iteration(child.path, run_id="", iteration=1) is None  # cursor names no run
    state = torch.load(child.path / "trainer_state.pt", weights_only=True)
    assert {int(s["step"]) for s in state["optimizer"]["state"].values()} == {1}

    again = train_iteration(
        artifact_dir=artifacts, parent=child, resume_optimizer=True, reference_dir=None,
        config=config(), data=to_rollout_data(batch(child.path, [0.0, 1.0, 1.0, 0.0], 1)),
        iteration=2, history=[outcome.stability], data_cursor={"iteration": 2})
    state = torch.load(again.checkpoint.path / "trainer_state.pt", weights_only=True)
    assert {int(s["step"]) for s in state["optimizer"]["state"].values()} == {2}


def test_a_batch_without_signal_changes_nothing(root: tuple[Path, CheckpointRef]) -> None:
    artifacts, parent = root
    before = sorted(p.name for p in (artifacts / "checkpoints").iterdir())
    outcome = train_iteration(
        artifact_dir=artifacts, parent=parent, resume_optimizer=False, reference_dir=None,
        config=config(), data=to_rollout_data(batch(parent.path, [-1.0, -1.0, 0.2, 0.2])),
        iteration=1, history=[], data_cursor={})

    assert outcome.checkpoint == parent and not outcome.weights_changed
    assert outcome.step_columns["loss"] is None and outcome.step_columns["entropy"] is None
    assert outcome.stability.token_entropy > 0
    assert sorted(p.name for p in (artifacts / "checkpoints").iterdir()) == before


def test_an_entropy_bonus_alone_is_a_learning_signal(root: tuple[Path, CheckpointRef]) -> None:
    """Zero advantages but an entropy bonus: the loss has a gradient, so the update runs."""
    artifacts, parent = root
    bonus = config().model_copy(update={"objective": config().objective.model_copy(
        update={"entropy_coef": 0.05})})
    outcome = train_iteration(
        artifact_dir=artifacts, parent=parent, resume_optimizer=False, reference_dir=None,
        config=bonus, data=to_rollout_data(batch(parent.path, [-1.0, -1.0, 0.2, 0.2])),
        iteration=1, history=[], data_cursor={})

    assert outcome.weights_changed and outcome.checkpoint.id != parent.id
    assert outcome.step_columns["loss"] is not None


def test_dynamic_sampling_drops_zero_variance_groups_and_records_the_rate(
    root: tuple[Path, CheckpointRef],
) -> None:
    artifacts, parent = root
    trajectories = batch(parent.path, [1.0, 0.0, 0.5, 0.5])  # g0 varies, g1 does not
    data = to_rollout_data(trajectories)
    on = config().model_copy(update={"sampling": config().sampling.model_copy(
        update={"dynamic_sampling": True})})
    outcome = train_iteration(
        artifact_dir=artifacts, parent=parent, resume_optimizer=False, reference_dir=None,
        config=on, data=data, iteration=1, history=[], data_cursor={"iteration": 1},
        series={"dynamic_sampling/resample_rounds": 1.0})
    series = outcome.step_columns["metrics"]["series"]
    assert series["dynamic_sampling/groups_dropped"] == 1.0
    assert series["dynamic_sampling/drop_rate"] == 0.5
    assert series["dynamic_sampling/resample_rounds"] == 1.0
    assert series["reward/task/t"] == 0.5
    update = outcome.step_columns["metrics"]["update"]
    assert update["samples"] == 2  # the zero-variance group's two samples left the loss


def test_the_learner_thread_keeps_its_torch_thread_limit() -> None:
    """TRILOOP_TORCH_THREADS holds in the learner's own thread (torch's pool is per thread)."""
    from learning_loop.activities.update import learner_executor

    want = (os.cpu_count() or 1) + 1  # neither torch's default nor this module's 1
    limited = learner_executor(want)
    try:
        assert limited.submit(torch.get_num_threads).result() == want
    finally:
        limited.shutdown()
    with pytest.raises(ValueError, match="torch_threads"):
        learner_executor(0)


def test_a_learner_kept_in_memory_continues_exactly_as_one_read_back_from_disk(
    tmp_path: Path, root: tuple[Path, CheckpointRef],
) -> None:
    """The run's next update may start from the learner the last one left in memory: the
    same weights, optimizer, scheduler and RNG as loading its checkpoint, so the same child."""
    _, base = root
    artifacts = tmp_path / "artifacts"
    first = train_iteration(
        artifact_dir=artifacts, parent=base, resume_optimizer=False, reference_dir=None,
        config=config(), data=to_rollout_data(batch(base.path, [1.0, 0.0, 0.5, -0.5])),
        iteration=1, history=[], data_cursor={"iteration": 1})
    assert first.learner is not None and first.learner.checkpoint_id == first.checkpoint.id
    parent = first.checkpoint
    data = to_rollout_data(batch(parent.path, [0.0, 1.0, 1.0, 0.0], 1))

    def second(warm: WarmLearner | None, into: Path) -> IterationOutcome:
        return train_iteration(
            artifact_dir=into, parent=parent, resume_optimizer=True, reference_dir=None,
            config=config(), data=data, iteration=2, history=[first.stability],
            data_cursor={"iteration": 2}, warm=warm)

    from_disk = second(None, tmp_path / "cold")
    # The warm learner never reads its checkpoint: without its weights and trainer state
    # on disk it still trains (only the config and tokenizer files are copied from it).
    for name in ("model.safetensors", "trainer_state.pt"):
        (parent.path / name).unlink()
    from_memory = second(first.learner, tmp_path / "warm")
    assert from_memory.checkpoint.id == from_disk.checkpoint.id != parent.id
    assert from_memory.step_columns["loss"] == from_disk.step_columns["loss"]
    # A learner left by another checkpoint is not used: that update reads its parent.
    with pytest.raises(CheckpointError):
        second(WarmLearner("another", *_learner_parts(first)), tmp_path / "other")


def _learner_parts(outcome: IterationOutcome) -> tuple[Any, ...]:
    learner = outcome.learner
    assert learner is not None
    return learner.model, learner.optimizer, learner.scheduler, learner.rng
