"""A training run whose update runs as two torchrun ranks (gloo, CPU), end to end.

Real Temporal, PostgreSQL and OPA; the learning-gpu worker's activity launches the
ranks, rank 0 saves the checkpoint once, and the iteration is stored as any other.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import Engine
from temporalio.client import Client

from learning_loop.checkpoints import saved_weights_digest
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
from triloop.workflow_api import RunStatus

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_learning_fixtures"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from learning_loop.tiny_model import create_tiny_model

    torch.set_num_threads(1)
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


async def test_a_run_updates_with_two_ranks(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path
) -> None:
    own = queue_settings(settings)
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, [1, 2])
    # A KL term: the update always has a signal (a random policy may earn equal rewards),
    # and the ranks load the reference too.
    config = run_config(tiny_dir, tasks, update={"micro_batch_size": 2, "world_size": 2},
                        objective={"kl_coef": 0.01},
                        schedule={"iterations": 1, "propose_every": 1})
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own):
        handle = await start_run(client, own, run_id, config, alice)
        result: RunStatus = await asyncio.wait_for(handle.result(), 600)

    assert result.iterations_done == 1
    [step] = rows(owner_engine, "SELECT * FROM training_step WHERE run_id = :r", r=run_id)
    update = step["metrics"]["update"]
    assert update["samples"] >= 8 and update["device"] == "cpu"
    assert update["reference_kl"] is not None and update["optimizer_steps"] == 1
    [child] = rows(owner_engine, "SELECT * FROM checkpoint WHERE run_id = :r", r=run_id)
    assert child["id"] == step["checkpoint_id"] == result.latest_checkpoint_id
    directory = Path(child["artifact_uri"].removeprefix("file://"))
    assert saved_weights_digest(directory) == child["id"]
    assert not list(directory.parent.parent.glob(".ranks-*"))  # the working folder is gone
