"""A stand-in for governance's PromotionWorkflow, registered under the real name.

The learning tests are about the learning loop proposing a candidate (a proposal row and
a signal-with-start on governance's queue); what governance then does is its own tests'
business, so a collaborator this small stands in for it. Only temporalio is imported
here, so the workflow sandbox loads this module quickly.
"""

from __future__ import annotations

from temporalio import workflow

from triloop.workflow_api import PROMOTION_PROPOSED_SIGNAL, PROMOTION_WORKFLOW, PromotionInput


@workflow.defn(name=PROMOTION_WORKFLOW, sandboxed=False)
class StandInPromotionWorkflow:
    """Records the proposal it was started with and the proposed signals it received."""

    def __init__(self) -> None:
        self.signals: list[str] = []

    @workflow.signal(name=PROMOTION_PROPOSED_SIGNAL)
    def proposed(self, proposal: PromotionInput | None = None) -> None:
        self.signals.append(proposal.proposal_id if proposal else "")

    @workflow.run
    async def run(self, request: PromotionInput) -> dict[str, object]:
        await workflow.wait_condition(lambda: bool(self.signals))
        return {"proposal_id": request.proposal_id, "checkpoint_id": request.checkpoint_id,
                "run_id": request.run_id, "submitted_by": request.submitted_by,
                "signals": list(self.signals),
                "stability_alarms": [[a.iteration, a.kind] for a in request.stability_alarms]}
