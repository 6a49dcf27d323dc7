"""AdmissionWorkflow: the execution loop's probe gathers evidence, an operator decides."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, NexusOperationError

with workflow.unsafe.imports_passed_through():
    import governance_loop.contracts as m
    from governance_loop.gates import HumanDecisionError
    from governance_loop.workflows._shared import execution_loop, failure_chain, refusal
    from triloop.nexus_api import ExecutionService
    from triloop.statuses import TaskStatus
    from triloop.workflow_api import (
        ADMISSION_DECIDE_UPDATE,
        ADMISSION_STATUS_QUERY,
        ADMISSION_WORKFLOW,
        AdmissionInput,
        AdmissionProbeEvidence,
        AdmissionProbeInput,
        AdmissionResult,
        DecisionRef,
    )


# Resets and k reference runs in the execution loop, through its Nexus operation.
PROBE_TIMEOUT = timedelta(minutes=30)


@workflow.defn(name=ADMISSION_WORKFLOW)
class AdmissionWorkflow:
    """The four questions answered by the execution loop's probe, then an operator decides."""

    def __init__(self) -> None:
        self._result = AdmissionResult(task_id="", status="assessing")
        self._decision: str | None = None
        self._deciding = False

    @workflow.query(name=ADMISSION_STATUS_QUERY)
    def status(self) -> AdmissionResult:
        """The assessment so far and the decision, if any."""
        return self._result

    @workflow.run
    async def run(self, request: AdmissionInput) -> AdmissionResult:
        """Probe, assess, store, then wait for the operator (fail closed at the deadline)."""
        self._result.task_id = request.task_id
        task = await m.LOAD_ADMISSION_TASK.call(m.AdmissionTaskRequest(task_id=request.task_id))
        if task.status != TaskStatus.pending or task.problem:
            self._result.status = (task.status if task.status != TaskStatus.pending
                                   else TaskStatus.rejected)
            self._result.reasons = [task.problem or f"task is already {task.status}"]
            return self._result
        probe: AdmissionProbeEvidence | None = None
        error: str | None = None
        try:
            probe = await execution_loop().execute_operation(
                ExecutionService.probe_admission,
                AdmissionProbeInput(task_id=request.task_id, resets=task.resets,
                                    reference_runs=task.reference_runs),
                schedule_to_close_timeout=PROBE_TIMEOUT,
            )
        except NexusOperationError as failure:
            # The whole chain: the activity's own refusal is a cause of its ActivityError.
            error = failure_chain(failure.cause or failure)
        assessment = await m.RECORD_ADMISSION_EVIDENCE.call(
            m.AdmissionEvidenceInput(task_id=request.task_id, probe=probe, probe_error=error))
        self._result.admissible = assessment.admissible
        self._result.reasons = list(assessment.reasons)
        self._result.status = "awaiting_decision"
        try:
            await workflow.wait_condition(lambda: self._decision is not None,
                                          timeout=timedelta(seconds=task.decision_deadline_s))
        except TimeoutError:
            await workflow.wait_condition(lambda: not self._deciding)
        if self._decision is None:
            decided = await m.DECIDE_TASK_ADMISSION.call(m.AdmissionDecisionInput(
                task_id=request.task_id,
                automatic_reason=f"no operator decision within {task.decision_deadline_s:g}s",
            ))
            self._result.status = decided.status
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._result

    @workflow.update(name=ADMISSION_DECIDE_UPDATE)
    async def decide_admission(self, decision: DecisionRef) -> AdmissionResult:
        """An operator admits (only an admissible task) or rejects: their recorded decision."""
        self._deciding = True
        try:
            decided = await m.DECIDE_TASK_ADMISSION.call(m.AdmissionDecisionInput(
                task_id=self._result.task_id, decision_id=decision.decision_id),
                retry=m.HUMAN_RETRY)
        except ActivityError as error:
            raise refusal(error) from error
        finally:
            self._deciding = False
        self._decision = decided.decision
        self._result.status = decided.status
        self._result.decided_by = decided.decided_by
        return self._result

    @decide_admission.validator
    def _validate_decision(self, decision: DecisionRef) -> None:
        if self._result.status != "awaiting_decision" or self._deciding:
            raise HumanDecisionError(f"the admission is {self._result.status}; no decision now")
        if not decision.decision_id:
            raise HumanDecisionError(
                "an admission decision is the id of the decision the web service recorded")
