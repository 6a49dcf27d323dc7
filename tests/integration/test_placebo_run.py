"""A placebo run on the real Temporal, PostgreSQL and OPA with the tiny model on CPU: it
trains like any run and proposes nothing, and its end names the placebo checkpoint."""

from __future__ import annotations

import asyncio
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
from triloop.workflow_api import RunStatus

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_learning_fixtures"]


async def test_a_placebo_run_trains_and_never_proposes(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path,
) -> None:
    own_settings = queue_settings(settings)
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, [7])
    # Every iteration would propose, were it not a placebo.
    config = run_config(tiny_dir, tasks, rollout={"groups_per_iteration": 1},
                        advantage={"zero_task_reward": True},
                        schedule={"iterations": 2, "propose_every": 1})
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice)
        result: RunStatus = await asyncio.wait_for(handle.result(), 300)

    assert result.iterations_done == 2 and result.proposals == []
    assert rows(owner_engine, "SELECT id FROM proposal WHERE run_id = :r", r=run_id) == []
    (run_row,) = rows(owner_engine, "SELECT * FROM training_run WHERE id = :r", r=run_id)
    assert run_row["status"] in ("completed", "completed_with_alarms")
    assert (f"its last checkpoint {result.latest_checkpoint_id} is the placebo, never proposed"
            in run_row["status_reason"])
    steps = rows(owner_engine, "SELECT iteration, checkpoint_id FROM training_step "
                 "WHERE run_id = :r ORDER BY iteration", r=run_id)
    assert [s["iteration"] for s in steps] == [1, 2]
