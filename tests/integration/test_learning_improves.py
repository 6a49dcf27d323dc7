"""The loop learns: GRPO through the real TrainingRunWorkflow lifts the tiny model's reward.

On the built-in frozen_lake game (four admitted maps, fixed seeds) the randomly
initialised tiny model mostly writes text that is not a move (-0.1 per turn, about -0.85
per episode). After sixteen iterations of rollout + update it has learned to answer with
moves. Base and final checkpoints are then evaluated the same way (an ``eval`` batch of
the execution loop: same maps, same episode seeds) and the final mean reward must beat
the base's by ``MARGIN``. Measured on 2 CPU cores: base about -0.85, final -0.64 to +0.24
(margins 0.27, 0.46, 1.11; task ids are random and seed the episodes, so runs differ),
100-120 s in all; the test fails past ``TIME_LIMIT_S``. The difference of two eval-batch
means has a standard error near 0.06, so ``MARGIN`` is well above noise while leaving room
for the run-to-run spread of what 16 iterations learn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from tests.factories_learning import (
    frozen_lake_tasks,
    loops_running,
    make_run,
    make_user,
    queue_settings,
    rows,
    run_config,
    start_run,
)
from triloop.config import Settings
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
    RunStatus,
)

pytestmark = [pytest.mark.learning, pytest.mark.slow, pytest.mark.integration]
SEEDS = (11, 12, 13, 14)
MARGIN = 0.15  # reward units per episode; an episode's reward lies in about [-1, 1.2]
TIME_LIMIT_S = 180.0
# Tuned on 2 CPU cores: a high learning rate suits a ~150k-parameter random init.
TRAINING = {
    "rollout": {"group_size": 8, "groups_per_iteration": 4, "temperature": 1.0},
    "optimizer": {"learning_rate": 3e-2},
    "update": {"micro_batch_size": 64, "max_grad_norm": 1.0, "optimizer_steps_per_batch": 4},
    "schedule": {"iterations": 16, "propose_every": 16, "seed": 0},
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a fixed seed, created locally (no download)."""
    import torch

    from learning_loop.tiny_model import create_tiny_model

    torch.set_num_threads(1)
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    """A Temporal client standing in for the web service."""
    yield await connect(settings, identity="web-test")


async def evaluate(client: Client, settings: Settings, tasks: list[str], checkpoint: str,
                   name: str) -> float:
    """Mean episode reward of a checkpoint on the run's maps (an execution-loop eval batch)."""
    batch = RolloutBatchInput(
        batch_id=f"{name}-{checkpoint[:12]}", purpose="eval",
        items=[RolloutItem(task, seed, group_size=8) for task, seed in zip(tasks, SEEDS,
                                                                           strict=True)],
        checkpoint_id=checkpoint, max_concurrency=4, deadline_s=120, temperature=1.0,
    )
    result: RolloutBatchResult = await client.execute_workflow(
        ROLLOUT_WORKFLOW, batch, id=f"eval-{batch.batch_id}",
        task_queue=settings.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult,
    )
    assert result.completed + result.truncated == 32, result
    return result.mean_reward


async def test_tiny_model_learns_frozen_lake(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path
) -> None:
    started = time.monotonic()
    own = queue_settings(settings)
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, SEEDS)
    config = run_config(tiny_dir, tasks, **TRAINING)
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own):
        handle = await start_run(client, own, run_id, config, alice)
        result: RunStatus = await asyncio.wait_for(handle.result(), TIME_LIMIT_S)
        trained = time.monotonic() - started
        assert result.status == "completed" and result.latest_checkpoint_id
        base = await evaluate(client, own, tasks, result.base_checkpoint_id or "", run_id)
        final = await evaluate(client, own, tasks, result.latest_checkpoint_id, run_id)
    elapsed = time.monotonic() - started

    curve = [r["reward_mean"] for r in rows(
        owner_engine, "SELECT reward_mean FROM training_step WHERE run_id = :r ORDER BY iteration",
        r=run_id)]
    report = (f"base {base:+.3f}, final {final:+.3f}, margin {final - base:+.3f};"
              f" training {trained:.0f}s, total {elapsed:.0f}s; rewards by iteration"
              f" {[round(r, 2) for r in curve]}")
    print(report)
    assert final - base >= MARGIN, report
    assert elapsed < TIME_LIMIT_S, report
