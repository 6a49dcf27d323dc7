"""A rollback reaches running production batches at their next episode, not their next batch."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from execution_loop.inference.base import PolicyClient
from execution_loop.worker import build_worker
from tests.factories_execution import (
    StuckPolicy,
    make_builtin_task,
    register_variant,
    request_batch,
    set_routing,
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
    yield await connect(settings, identity="rerouting-test", service="execution")


async def test_next_episode_follows_a_rollback(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path, tmp_path: Path
) -> None:
    own = settings.model_copy(
        update={"task_queue_prefix": f"{settings.task_queue_prefix}{uuid.uuid4().hex[:6]}-"})
    promoted, target = (register_variant(owner_engine, tiny_dir, tmp_path) for _ in "pt")
    set_routing(owner_engine, "canary", None)
    set_routing(owner_engine, "shadow", None)
    set_routing(owner_engine, "production", promoted)
    # A seed of its own (production traffic holds its task out of every later training
    # batch) where moving right never ends an episode early, as on seed 6.
    task = make_builtin_task(owner_engine, "frozen_lake", seed=606)
    batch = RolloutBatchInput(batch_id=f"r{uuid.uuid4().hex[:10]}", purpose="production",
                              items=[RolloutItem(task, 606, group_size=4)], max_concurrency=1,
                              deadline_s=240)

    def slow(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        return StuckPolicy(checkpoint_id, model_dir, delay_s=0.2)  # ~2 s per episode

    def served() -> dict[str, tuple[str, dict[str, object]]]:
        with owner_engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT id, checkpoint_id, outcome FROM trajectory WHERE batch_id = :b"),
                {"b": batch.batch_id}).all()
        return {row[0]: (row[1], row[2]) for row in rows}

    async with build_worker(client, own, policy_factory=slow):
        handle = await client.start_workflow(
            ROLLOUT_WORKFLOW, request_batch(owner_engine, batch), id=f"rollout-{batch.batch_id}",
            task_queue=own.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult)
        while not served():  # the first episode ran on the promoted checkpoint
            await asyncio.sleep(0.2)
        set_routing(owner_engine, "production", target)  # what a rollback does to routing
        result = await handle.result()

    rows = served()
    assert len(rows) == 4
    first = min(rows)
    assert rows[first][0] == promoted
    later = [rows[e] for e in sorted(rows)[2:]]  # the episode in flight may finish as it began
    assert all(checkpoint == target and outcome["rerouted_from"] == promoted
               for checkpoint, outcome in later)
    assert result.checkpoints == {e: rows[e][0] for e in rows}
