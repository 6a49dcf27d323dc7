"""RollbackWorkflow: an operator's rollback, authorized for the person, one transaction."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import governance_loop.contracts as m
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
        # An operator waits on this answer: the few retries of a person's request.
        return await m.ROLLBACK_DEPLOYMENT.call(request, retry=m.HUMAN_RETRY)
