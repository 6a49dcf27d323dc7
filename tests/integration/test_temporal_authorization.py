"""The Temporal server itself refuses a loop that reaches into another loop's namespace.

The session's server is the real one, with JWT authorization on (see the conftest). A
process holding the learning worker's token tries every way of moving a governance
workflow; the server refuses each one. Between loops, only Nexus operations pass, and the
serving loop's handler asks OPA whether the calling loop may ask for that purpose.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from temporalio import workflow
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.exceptions import NexusOperationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.temporal_helpers import execution_nexus, loop_client, own_queues
from triloop.config import Settings
from triloop.devstack.temporal_keys import mint_token
from triloop.nexus_api import ExecutionService, endpoint_for
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    GOVERNANCE_QUEUE,
    LEARNING_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
)

pytestmark = pytest.mark.integration


@workflow.defn(name="GovernanceTarget")
class GovernanceTarget:
    """A governance workflow that counts what reaches it."""

    def __init__(self) -> None:
        self.touched: list[str] = []
        self.done = False

    @workflow.run
    async def run(self) -> list[str]:
        await workflow.wait_condition(lambda: self.done)
        return self.touched

    @workflow.signal(name="poke")
    def poke(self) -> None:
        self.touched.append("signal")

    @workflow.update(name="decide")
    def decide(self, decision: str) -> str:
        self.touched.append(f"update {decision}")
        return decision

    @workflow.signal(name="finish")
    def finish(self) -> None:
        self.done = True


@workflow.defn(name=ROLLOUT_WORKFLOW)
class InstantRollout:
    """Stands in for the rollout workflow: answers at once."""

    @workflow.run
    async def run(self, batch: RolloutBatchInput) -> RolloutBatchResult:
        return RolloutBatchResult(batch_id=batch.batch_id)


@workflow.defn(name="AskExecution")
class AskExecution:
    """A learning workflow asking execution for a batch of some purpose."""

    @workflow.run
    async def run(self, purpose: str) -> str:
        execution = workflow.create_nexus_client(
            service=ExecutionService,
            endpoint=endpoint_for(workflow.info().task_queue, "execution"))
        result = await execution.execute_operation(
            ExecutionService.run_rollouts,
            RolloutBatchInput(batch_id=f"ask-{purpose}-{workflow.info().run_id[:8]}",
                              purpose=purpose, items=[]),
            schedule_to_close_timeout=timedelta(seconds=60))
        return result.batch_id


async def test_learning_credentials_cannot_move_a_governance_workflow(settings: Settings) -> None:
    own = own_queues(settings, "authz-")
    governance = await loop_client(own, "governance", "governance-test")
    queue = own.task_queue(GOVERNANCE_QUEUE)
    async with Worker(governance, task_queue=queue, workflows=[GovernanceTarget],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        target = await governance.start_workflow(
            GovernanceTarget.run, id=f"target-{uuid.uuid4().hex[:8]}", task_queue=queue)
        # The learning worker's own token, aimed at governance's namespace.
        intruder = await connect(own, identity="learning-intruder", service="learning",
                                 loop="governance")
        handle = intruder.get_workflow_handle(target.id)
        namespace = own.temporal_namespace("governance")
        attempts: dict[str, Callable[[], Awaitable[Any]]] = {
            "update": lambda: handle.execute_update("decide", "promote"),
            "signal": lambda: handle.signal("poke"),
            "start": lambda: intruder.start_workflow(
                "GovernanceTarget", id=f"forged-{uuid.uuid4().hex[:8]}", task_queue=queue),
            "signal-with-start": lambda: intruder.start_workflow(
                "GovernanceTarget", id=target.id, task_queue=queue, start_signal="poke"),
            "terminate": lambda: handle.terminate("learning wants this gone"),
            "reset": lambda: intruder.workflow_service.reset_workflow_execution(
                ResetWorkflowExecutionRequest(
                    namespace=namespace, reason="learning rewinds governance",
                    workflow_execution=WorkflowExecution(workflow_id=target.id),
                    workflow_task_finish_event_id=3, request_id=str(uuid.uuid4()))),
        }
        for what, attempt in attempts.items():
            with pytest.raises(RPCError) as refused:
                await attempt()
            assert refused.value.status == RPCStatusCode.PERMISSION_DENIED, what

        # Nothing reached the workflow; its own loop still drives it.
        await target.signal("finish")
        assert await target.result() == []


async def test_a_token_the_server_did_not_sign_or_no_token_is_refused(
    settings: Settings,
) -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    namespace = settings.temporal_namespace("learning")
    forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = mint_token(forger, subject="triloop-learning", grants=[f"{namespace}:write"])
    # A forged signature fails at the first call (connecting); no token at the first write.
    with pytest.raises(RuntimeError, match="PermissionDenied"):
        await Client.connect(settings.temporal_address, namespace=namespace, api_key=forged,
                             tls=False)
    anonymous = await Client.connect(settings.temporal_address, namespace=namespace, tls=False)
    with pytest.raises(RPCError) as refused:
        await anonymous.start_workflow("Anything", id=f"x-{uuid.uuid4().hex[:8]}",
                                       task_queue=settings.task_queue(LEARNING_QUEUE))
    assert refused.value.status == RPCStatusCode.PERMISSION_DENIED


async def test_execution_serves_learning_training_batches_only(
    settings: Settings, owner_engine: Engine,
) -> None:
    own = own_queues(settings, "nexus-")
    learning = await loop_client(own, "learning", "learning-test")
    execution = await loop_client(own, "execution", "execution-test")
    async with Worker(learning, task_queue=own.task_queue(LEARNING_QUEUE),
                      workflows=[AskExecution], workflow_runner=UnsandboxedWorkflowRunner()), \
            Worker(execution, task_queue=own.task_queue(EXECUTION_QUEUE),
                   workflows=[InstantRollout], workflow_runner=UnsandboxedWorkflowRunner(),
                   nexus_service_handlers=[execution_nexus(own)]):
        allowed = await learning.execute_workflow(
            AskExecution.run, "training", id=f"ask-{uuid.uuid4().hex[:8]}",
            task_queue=own.task_queue(LEARNING_QUEUE))
        assert allowed.startswith("ask-training-")
        with pytest.raises(Exception) as refused:
            await learning.execute_workflow(
                AskExecution.run, "eval", id=f"ask-{uuid.uuid4().hex[:8]}",
                task_queue=own.task_queue(LEARNING_QUEUE))
    failure = refused.value.__cause__
    assert isinstance(failure, NexusOperationError)
    assert "execution refuses run_rollouts (eval) to learning" in str(failure.__cause__)
    with owner_engine.connect() as conn:
        denied = conn.execute(text(
            "SELECT actor->>'service', resource->'attrs'->>'caller', db_role FROM audit_event "
            "WHERE action = 'serve' AND decision = 'deny' AND resource->>'kind' = "
            "'nexus_operation' AND resource->'attrs'->>'purpose' = 'eval' "
            "AND resource->'attrs'->>'batch_id' LIKE 'ask-eval-%'")).all()
    assert [tuple(row) for row in denied] == [("execution", "learning", "triloop_execution")]
