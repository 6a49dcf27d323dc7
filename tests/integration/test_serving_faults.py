"""An injected serving fault degrades only its checkpoint's production episodes, on record."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from execution_loop.worker import build_worker
from tests.factories_execution import (
    make_builtin_task,
    register_checkpoint_dir,
    request_batch,
    set_routing,
)
from triloop.config import Settings
from triloop.faults import ServingFault, clear_serving_faults, inject_serving_fault
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
    yield await connect(settings, identity="faults-test", service="execution")


async def test_fault_degrades_production_of_its_checkpoint_and_is_recorded(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path, tmp_path: Path
) -> None:
    prefix = f"{settings.task_queue_prefix}{uuid.uuid4().hex[:6]}-"
    own = settings.model_copy(update={"home": tmp_path, "task_queue_prefix": prefix,
                                      "secrets_dir": settings.secrets})
    production = register_checkpoint_dir(owner_engine, tiny_dir)
    set_routing(owner_engine, "production", production)
    set_routing(owner_engine, "canary", None)
    set_routing(owner_engine, "shadow", None)
    # A seed of its own: production traffic holds its task out of every later training batch.
    task = make_builtin_task(owner_engine, "frozen_lake", seed=505)
    inject_serving_fault(tmp_path, ServingFault(production, 50.0, "game day"))

    async def batch(purpose: str, checkpoint: str | None) -> str:
        spec = RolloutBatchInput(batch_id=f"f{uuid.uuid4().hex[:10]}", purpose=purpose,
                                 items=[RolloutItem(task, 505, group_size=3)],
                                 checkpoint_id=checkpoint, max_concurrency=3, deadline_s=120,
                                 temperature=1.0)
        await client.execute_workflow(
            ROLLOUT_WORKFLOW, request_batch(owner_engine, spec), id=f"rollout-{spec.batch_id}",
            task_queue=own.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult)
        return spec.batch_id

    async with build_worker(client, own):
        served = await batch("production", None)
        evaluated = await batch("eval", production)
        assert clear_serving_faults(tmp_path) == 1
        healed = await batch("production", None)

    def outcomes(batch_id: str) -> list[dict[str, object]]:
        with owner_engine.connect() as conn:
            return list(conn.execute(text(
                "SELECT outcome FROM trajectory WHERE batch_id = :b AND purpose <> 'shadow'"),
                {"b": batch_id}).scalars())

    assert [o.get("injected_fault") for o in outcomes(served)] == [
        {"checkpoint_id": production, "temperature": 50.0, "note": "game day"}] * 3
    # Eval batches name their checkpoint and are never degraded; a cleared fault is gone.
    assert all("injected_fault" not in o for o in outcomes(evaluated))
    assert all("injected_fault" not in o for o in outcomes(healed))
