"""The execution loop's Nexus operations: the work other loops may ask of it.

Each operation first names the calling loop from the server's link and asks OPA, with the
execution service's own token, whether that loop may ask for this purpose (learning:
training batches only; governance: eval, shadow, canary and probe batches, and admission
probes). A training batch's request also carries, read from PostgreSQL, each of its
tasks that is held out (in a frozen eval set or in production traffic): the policy refuses
any, and the refusal is audited. A batch's ``rollout_batch`` row then says who asked:
this handler records learning's, with its planned episodes and its tasks (the database
refuses a held-out training task again), and checks the one governance recorded for
itself. Then it starts the workflow here, in the execution namespace, under the execution
worker's identity; the caller's workflow receives the result when it ends.
"""

from __future__ import annotations

import asyncio

import nexusrpc
from sqlalchemy import Engine
from temporalio import nexus

from execution_loop.batches import (
    BatchConflict,
    batch_tasks,
    training_conflicts,
    vouch_for_batch,
)
from execution_loop.workflows import (
    AdmissionProbeWorkflow,
    DescribeTasksWorkflow,
    RolloutWorkflow,
)
from triloop import search_attributes
from triloop.nexus_api import ExecutionService
from triloop.nexus_caller import NexusCallerCheck
from triloop.statuses import Purpose
from triloop.workflow_api import (
    AdmissionProbeEvidence,
    AdmissionProbeInput,
    DescribeTasksInput,
    DescribeTasksResult,
    RolloutBatchInput,
    RolloutBatchResult,
    describe_tasks_workflow_id,
    rollout_workflow_id,
)


@nexusrpc.handler.service_handler(service=ExecutionService)
class ExecutionNexusHandlers:
    """Start a rollout batch, an admission probe or a task description for a loop that may
    ask for it."""

    def __init__(self, check: NexusCallerCheck, engine: Engine) -> None:
        self._check = check
        self._engine = engine

    @nexus.workflow_run_operation
    async def run_rollouts(
        self, ctx: nexus.WorkflowRunOperationContext, batch: RolloutBatchInput
    ) -> nexus.WorkflowHandle[RolloutBatchResult]:
        """A batch of episodes; its purpose decides who may ask for it.

        Before any episode runs, the batch's row must name the caller as its requester
        with this plan: learning's is recorded here (the request this handler received),
        any other caller's is the row it recorded itself, which this handler only checks.
        """
        caller = await self._check.admit(ctx, purpose=batch.purpose,
                                         attrs=await self._batch_facts(batch))
        try:
            await asyncio.to_thread(vouch_for_batch, engine=self._engine, batch=batch,
                                    caller=caller)
        except BatchConflict as conflict:
            raise nexusrpc.HandlerError(str(conflict), type=nexusrpc.HandlerErrorType.BAD_REQUEST,
                                        retryable_override=False) from conflict
        return await ctx.start_workflow(
            RolloutWorkflow.run, batch, id=rollout_workflow_id(batch.batch_id),
            search_attributes=search_attributes.attributes(loop="execution",
                                                           run_id=batch.run_id))

    async def _batch_facts(self, batch: RolloutBatchInput) -> dict[str, object]:
        """What the policy decides a batch on; for training, its held-out tasks."""
        facts: dict[str, object] = {"batch_id": batch.batch_id, "run_id": batch.run_id or ""}
        if batch.purpose == Purpose.TRAINING:
            conflicts = await asyncio.to_thread(training_conflicts, engine=self._engine,
                                                batch=batch)
            facts["task_ids"] = batch_tasks(batch)
            facts["held_out_conflicts"] = [c.to_fact() for c in conflicts]
        return facts

    @nexus.workflow_run_operation
    async def probe_admission(
        self, ctx: nexus.WorkflowRunOperationContext, request: AdmissionProbeInput
    ) -> nexus.WorkflowHandle[AdmissionProbeEvidence]:
        """Resets and reference runs of a task, for governance's admission."""
        await self._check.admit(ctx, purpose="admission", attrs={"task_id": request.task_id})
        return await ctx.start_workflow(AdmissionProbeWorkflow.run, request,
                                        id=f"admission-probe-{request.task_id}")

    @nexus.workflow_run_operation
    async def describe_tasks(
        self, ctx: nexus.WorkflowRunOperationContext, request: DescribeTasksInput
    ) -> nexus.WorkflowHandle[DescribeTasksResult]:
        """Content digests and tags of a task set's tasks, for governance's registration."""
        await self._check.admit(ctx, purpose="registration", attrs={
            "environment_version_id": request.environment_version_id})
        return await ctx.start_workflow(DescribeTasksWorkflow.run, request,
                                        id=describe_tasks_workflow_id(request.request_id))
