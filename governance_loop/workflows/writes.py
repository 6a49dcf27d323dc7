"""GovernanceWriteWorkflow: a person's recorded write, carried out by one activity.

The web service recorded the decision (an environment version to register, an eval set
to freeze, a threshold to set); the activity proves it, asks OPA for the person and writes
in one transaction. Refusals are never retried: a bad contract stays bad.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import governance_loop.contracts as m
    from triloop.activity_contract import ActivityContract
    from triloop.statuses import DecisionKind
    from triloop.workflow_api import (
        GOVERNANCE_WRITE_WORKFLOW,
        ErrorType,
        GovernanceWriteInput,
        GovernanceWriteResult,
    )

# decision kind -> the activity that carries it out
WriteActivity = ActivityContract[GovernanceWriteInput, GovernanceWriteResult]
WRITE_ACTIVITIES: dict[str, WriteActivity] = {
    DecisionKind.ENVIRONMENT_VERSION: m.REGISTER_ENVIRONMENT_VERSION,
    DecisionKind.EVAL_SET: m.CREATE_EVAL_SET,
    DecisionKind.THRESHOLD: m.SET_THRESHOLD,
}


@workflow.defn(name=GOVERNANCE_WRITE_WORKFLOW)
class GovernanceWriteWorkflow:
    """One person's write to governance's versioned data."""

    @workflow.run
    async def run(self, request: GovernanceWriteInput) -> GovernanceWriteResult:
        """Run the activity for the decision's kind and return what it stored."""
        activity = WRITE_ACTIVITIES.get(request.kind)
        if activity is None:
            raise ApplicationError(f"no governance write for decision kind {request.kind!r}",
                                   type=ErrorType.GOVERNANCE_REFUSED, non_retryable=True)
        return await activity.call(request)
