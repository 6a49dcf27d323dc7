"""One ``serve()`` for every loop's worker: it polls what the loop built, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.temporal_helpers import loop_client
from triloop.config import Settings
from triloop.worker_serve import serve, worker_identity

pytestmark = pytest.mark.integration


@workflow.defn(name="ServeProbe")
class ServeProbe:
    """Answers at once: proof that the served worker polls."""

    @workflow.run
    async def run(self, name: str) -> str:
        """Say who was served."""
        return f"served {name}"


async def test_serve_polls_the_built_workers_until_sigterm(settings: Settings) -> None:
    queue = settings.task_queue(f"serve-{uuid.uuid4().hex[:8]}")
    identities: list[str | None] = []

    def build(client: Client) -> list[Worker]:
        identities.append(client.identity)
        return [Worker(client, task_queue=queue, workflows=[ServeProbe],
                       workflow_runner=UnsandboxedWorkflowRunner())]

    serving = asyncio.create_task(serve(settings, "governance", build))
    client = await loop_client(settings, "governance", "serve-test")
    answer = await asyncio.wait_for(client.execute_workflow(
        ServeProbe.run, "probe", id=f"serve-{uuid.uuid4().hex[:8]}", task_queue=queue), 120)
    assert answer == "served probe"
    assert identities == [worker_identity("governance")]
    assert not serving.done()
    os.kill(os.getpid(), signal.SIGTERM)  # serve's handler takes it: the process lives on
    await asyncio.wait_for(serving, 60)
    # The handlers went with it: SIGTERM would end the process again, as by default.
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler)
