"""Production traffic has backpressure: at most TRILOOP_MAX_PRODUCTION_BATCHES_IN_FLIGHT
batches run at once, and the next one gets 429 with Retry-After until one ends."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import Engine
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.factories import make_task
from tests.factories_web import Person, assert_problem
from triloop.config import Settings
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
)

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


@workflow.defn(name=ROLLOUT_WORKFLOW)
class HeldRollout:
    """Runs until signalled ``finish``: a batch that stays in flight."""

    def __init__(self) -> None:
        self.done = False

    @workflow.signal
    def finish(self) -> None:
        self.done = True

    @workflow.run
    async def run(self, batch: RolloutBatchInput) -> RolloutBatchResult:
        await workflow.wait_condition(lambda: self.done)
        return RolloutBatchResult(batch_id=batch.batch_id)


@pytest.fixture
def bounded_settings(settings: Settings) -> Settings:
    """A deployment of its own (own queues) whose bound is one batch."""
    return settings.model_copy(update={
        "task_queue_prefix": f"bp-{uuid.uuid4().hex[:8]}-",
        "max_production_batches_in_flight": 1, "production_retry_after_s": 7})


@pytest_asyncio.fixture(loop_scope="session")
async def bounded_api(bounded_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    from web.app import create_app

    app = create_app(bounded_settings, temporal_timeout_s=15.0)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def execution(bounded_settings: Settings) -> AsyncIterator[Client]:
    client = await connect(bounded_settings, identity="test-held", service="execution")
    async with Worker(client, task_queue=bounded_settings.task_queue(EXECUTION_QUEUE),
                      workflows=[HeldRollout], workflow_runner=UnsandboxedWorkflowRunner()):
        yield client


async def _running(client: Client, settings: Settings) -> int:
    query = (f'TaskQueue = "{settings.task_queue(EXECUTION_QUEUE)}" AND '
             'ExecutionStatus = "Running"')
    return (await client.count_workflows(query)).count


async def _until(predicate: object, timeout_s: float = 30.0) -> None:
    # Temporal's visibility store catches up with a start or an end within moments.
    for _ in range(int(timeout_s / 0.2)):
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.2)
    raise AssertionError("visibility did not catch up")


async def test_a_batch_beyond_the_bound_gets_429_with_retry_after(
    bounded_api: httpx.AsyncClient, execution: Client, bounded_settings: Settings,
    owner_engine: Engine, people: dict[str, Person],
) -> None:
    operator = people["operator"].headers
    task = make_task(owner_engine)
    body = {"items": [{"task_id": task, "group_size": 1}]}
    first = await bounded_api.post("/api/episodes", headers=operator, json=body)
    assert first.status_code == 202, first.text

    async def one_running() -> bool:
        return await _running(execution, bounded_settings) == 1

    await _until(one_running)
    refused = await bounded_api.post("/api/episodes", headers=operator, json=body)
    problem = assert_problem(refused, 429, "1 production batches are running", "bound is 1")
    assert refused.headers["retry-after"] == "7" and "7 s" in problem["detail"]

    await execution.get_workflow_handle(first.json()["workflow_id"]).signal("finish")

    async def none_running() -> bool:
        return await _running(execution, bounded_settings) == 0

    await _until(none_running)
    again = await bounded_api.post("/api/episodes", headers=operator, json=body)
    assert again.status_code == 202, again.text
    await execution.get_workflow_handle(again.json()["workflow_id"]).signal("finish")
