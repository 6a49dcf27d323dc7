"""TaskSetRegistration: an operator's task set, described by execution, written by governance.

1. ``prepare_task_set`` proves the recorded decision, asks OPA for the person and names
   what to describe (seeds, a generator's params, or a dataset by its sha256);
2. the execution loop's ``describe_tasks`` (Nexus) computes each task's content digest
   and tags where the environment code lives;
3. ``store_task_set`` splits, refuses a digest twice, and writes the set, its tasks and
   members in one transaction, audited;
4. the set's admission starts as a child workflow that outlives this one
   (``TASK_SET_ADMISSION_WORKFLOW``): the operator admits the set as one unit.

Refusals are never retried: a bad dataset stays bad; nothing is written before step 3.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError, NexusOperationError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    import governance_loop.contracts as m
    from governance_loop.workflows._shared import execution_loop, failure_chain
    from triloop.nexus_api import ExecutionService
    from triloop.workflow_api import (
        TASK_SET_ADMISSION_WORKFLOW,
        TASK_SET_REGISTRATION_WORKFLOW,
        ErrorType,
        GovernanceWriteInput,
        GovernanceWriteResult,
        TaskSetAdmissionInput,
        task_set_admission_workflow_id,
    )

# Describing thousands of tasks (a fixture's bytes or a reset each) in the execution loop.
DESCRIBE_TIMEOUT = timedelta(hours=1)


@workflow.defn(name=TASK_SET_REGISTRATION_WORKFLOW)
class TaskSetRegistration:
    """One operator's task set: described, written, and its admission started."""

    @workflow.run
    async def run(self, request: GovernanceWriteInput) -> GovernanceWriteResult:
        """Prepare, describe, store, then start the set's admission (when newly stored)."""
        describe = await m.PREPARE_TASK_SET.call(request)
        try:
            described = await execution_loop().execute_operation(
                ExecutionService.describe_tasks, describe,
                schedule_to_close_timeout=DESCRIBE_TIMEOUT)
        except NexusOperationError as failure:
            raise ApplicationError(f"the execution loop could not describe the tasks: "
                                   f"{failure_chain(failure)}", type=ErrorType.INVALID_REQUEST,
                                   non_retryable=True) from failure
        stored = await m.STORE_TASK_SET.call(m.TaskSetStoreInput(request=request,
                                                                 described=described))
        if stored.created:
            await workflow.start_child_workflow(
                TASK_SET_ADMISSION_WORKFLOW, TaskSetAdmissionInput(task_set_id=stored.id),
                id=task_set_admission_workflow_id(stored.id),
                task_queue=workflow.info().task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON)
        return stored
