"""A training run with update.lora through the real workflows: three iterations on the tiny
model, each saving an adapter checkpoint whose lineage names the base; rollouts run one
policy version ahead of the update, so the third iteration's were sampled by the execution
loop serving the first adapter on its base.

Real Temporal, PostgreSQL and OPA, as every run test.
"""

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
from triloop.weights import adapter_base_id, checkpoint_digest, is_adapter_dir
from triloop.workflow_api import RunStatus

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_learning_fixtures"]


async def test_a_lora_run_saves_adapter_checkpoints_on_its_base(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path
) -> None:
    own = queue_settings(settings)
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, [1, 2])
    # An entropy bonus: every update has a gradient on the adapters, so each iteration
    # saves new adapter weights (a random policy may earn equal rewards).
    config = run_config(tiny_dir, tasks, objective={"kl_coef": 0.01, "entropy_coef": 0.01},
                        update={"lora": {"rank": 4, "alpha": 8,
                                         "target_modules": ["q_proj", "v_proj", "down_proj"]}},
                        schedule={"iterations": 3, "propose_every": 3})
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own):
        handle = await start_run(client, own, run_id, config, alice)
        result: RunStatus = await asyncio.wait_for(handle.result(), 900)

    assert result.iterations_done == 3
    children = rows(owner_engine, "SELECT * FROM checkpoint WHERE run_id = :r ORDER BY"
                    " iteration", r=run_id)
    assert [c["iteration"] for c in children] == [1, 2, 3]
    base_id = children[0]["base_model"]
    [base] = rows(owner_engine, "SELECT * FROM checkpoint WHERE id = :i", i=base_id)
    assert base["parent_id"] is None
    assert [c["parent_id"] for c in children] == [base_id, *(c["id"] for c in children[:2])]
    for child in children:
        assert child["base_model"] == base_id
        assert child["data"]["adapter"] == {
            "kind": "lora", "base_checkpoint_id": base_id, "rank": 4, "alpha": 8,
            "target_modules": ["down_proj", "q_proj", "v_proj"]}
        directory = Path(child["artifact_uri"].removeprefix("file://"))
        assert is_adapter_dir(directory) and not (directory / "model.safetensors").exists()
        assert adapter_base_id(directory) == base_id
        assert checkpoint_digest(directory) == child["id"]
        assert child["tokenizer_sha256"] == base["tokenizer_sha256"]
        assert child["model_config_sha256"] == base["model_config_sha256"]
    assert result.latest_checkpoint_id == children[2]["id"]
    # Iterations 1 and 2 were sampled from the base (one-step overlap), the third from the
    # first adapter, which the execution loop served on that base.
    sampled = rows(owner_engine, "SELECT DISTINCT checkpoint_id FROM trajectory WHERE"
                   " run_id = :r", r=run_id)
    assert {r["checkpoint_id"] for r in sampled} == {base_id, children[0]["id"]}
