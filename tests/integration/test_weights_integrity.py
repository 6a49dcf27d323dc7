"""Weights swapped after they were evaluated are refused when they are next loaded to serve."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from execution_loop.worker import build_worker
from tests.factories_execution import (
    episode_failures,
    make_builtin_task,
    register_checkpoint_dir,
    request_batch,
    weights_variant,
)
from triloop.config import Settings
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    yield await connect(settings, identity="weights-integrity-test", service="execution")


async def test_swapped_weights_are_refused_at_serving_and_audited(
    client: Client, settings: Settings, owner_engine: Engine, tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    own = settings.model_copy(update={
        "task_queue_prefix": f"{settings.task_queue_prefix}{uuid.uuid4().hex[:6]}-"})
    served = weights_variant(tiny_model_dir, tmp_path)
    checkpoint = register_checkpoint_dir(owner_engine, served)
    task = make_builtin_task(owner_engine, "frozen_lake", seed=23)

    async def eval_batch() -> tuple[RolloutBatchInput, RolloutBatchResult, list[str]]:
        batch = RolloutBatchInput(batch_id=f"w{uuid.uuid4().hex[:10]}", purpose="eval",
                                  items=[RolloutItem(task, 23, group_size=2)],
                                  checkpoint_id=checkpoint, max_concurrency=1, deadline_s=120)
        async with build_worker(client, own):  # a fresh worker: nothing loaded yet
            handle = await client.start_workflow(
                ROLLOUT_WORKFLOW, request_batch(owner_engine, batch),
                id=f"rollout-{batch.batch_id}",
                task_queue=own.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult)
            result = await handle.result()
            history = await handle.fetch_history()
        failures = episode_failures(history)
        return batch, result, failures

    _, evaluated, failures = await eval_batch()
    assert (evaluated.completed + evaluated.truncated, evaluated.failed) == (2, 0)
    assert failures == []

    # After eval, someone replaces the weights file under the same checkpoint id.
    shutil.copyfile(weights_variant(tiny_model_dir, tmp_path) / "model.safetensors",
                    served / "model.safetensors")
    refused_batch, refused, failures = await eval_batch()
    assert refused.failed == 2 and refused.trajectory_ids == []
    # Each episode failed once, without retries, naming the checkpoint.
    assert len(failures) == 2
    assert all(f"WeightsIntegrityError: checkpoint {checkpoint} refused" in f for f in failures)
    with owner_engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM trajectory WHERE batch_id = :b"),
                              {"b": refused_batch.batch_id}).scalar_one()
        events = conn.execute(text(
            "SELECT actor->>'service', payload->>'problem' FROM audit_event "
            "WHERE action = 'integrity_violation' AND resource->>'id' = :c"),
            {"c": checkpoint}).all()
    assert stored == 0
    assert len(events) == 2
    assert all(service == "execution" and "hash to" in problem for service, problem in events)
