"""The governance loop's Nexus operation: taking a proposal from the learning loop.

Learning holds no permission in governance's namespace; it hands a proposed checkpoint to
``propose_candidate``. The handler names the caller from the server's link, asks OPA with
governance's own token whether that loop may propose, and only then opens the proposal's
promotion workflow here, under governance's identity. The workflow checks the proposal
row itself (it must exist and name this checkpoint and run) before any gate runs, and a
finished promotion is never reopened.
"""

from __future__ import annotations

import nexusrpc
from nexusrpc.handler import StartOperationContext, sync_operation
from temporalio import nexus
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from triloop import search_attributes
from triloop.nexus_api import GovernanceService, ProposalAccepted
from triloop.nexus_caller import NexusCallerCheck
from triloop.workflow_api import (
    GOVERNANCE_QUEUE,
    PROMOTION_PROPOSED_SIGNAL,
    PROMOTION_WORKFLOW,
    PromotionInput,
    promotion_workflow_id,
    sibling_queue,
)


@nexusrpc.handler.service_handler(service=GovernanceService)
class GovernanceNexusHandlers:
    """Open a promotion for a proposal, if the calling loop may propose."""

    def __init__(self, check: NexusCallerCheck) -> None:
        self._check = check

    @sync_operation
    async def propose_candidate(
        self, ctx: StartOperationContext, candidate: PromotionInput
    ) -> ProposalAccepted:
        """Signal-with-start the proposal's promotion workflow (once per proposal)."""
        await self._check.admit(ctx, purpose="proposal", attrs={
            "proposal_id": candidate.proposal_id, "checkpoint_id": candidate.checkpoint_id,
            "run_id": candidate.run_id})
        workflow_id = promotion_workflow_id(candidate.proposal_id)
        try:
            await nexus.client().start_workflow(
                PROMOTION_WORKFLOW, candidate, id=workflow_id,
                task_queue=sibling_queue(nexus.info().task_queue, GOVERNANCE_QUEUE),
                start_signal=PROMOTION_PROPOSED_SIGNAL, start_signal_args=[candidate],
                # A finished promotion for this proposal is never reopened by a retry.
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=search_attributes.attributes(
                    loop="governance", run_id=candidate.run_id,
                    candidate=candidate.checkpoint_id, proposal=candidate.proposal_id,
                    user=candidate.submitted_by),
            )
        except WorkflowAlreadyStartedError:
            nexus.logger.info("promotion %s already ran; not reopened", workflow_id)
            return ProposalAccepted(workflow_id, opened=False)
        return ProposalAccepted(workflow_id, opened=True)
