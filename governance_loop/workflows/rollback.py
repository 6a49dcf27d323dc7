"""RollbackWorkflow: an operator's rollback, authorized for the person, one transaction."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import governance_loop.activities.messages as m
    from triloop.workflow_api import ROLLBACK_WORKFLOW, ErrorType, RollbackInput, RollbackResult


@workflow.defn(name=ROLLBACK_WORKFLOW)
class RollbackWorkflow:
    """An operator's rollback: OPA for the person, then one transaction."""

    @workflow.run
    async def run(self, request: RollbackInput) -> RollbackResult:
        """Move the alias back to its rollback target."""
        if request.promotion_id is not None:
            raise ApplicationError("automatic rollbacks come only from a promotion's watch",
                                   type=ErrorType.GOVERNANCE_REFUSED, non_retryable=True)
        result: RollbackResult = await workflow.execute_activity(
            m.ROLLBACK_DEPLOYMENT, request, result_type=RollbackResult,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200),
                                     maximum_attempts=5,
                                     non_retryable_error_types=[ErrorType.POLICY_DENIED,
                                                                ErrorType.GOVERNANCE_REFUSED]),
        )
        return result
