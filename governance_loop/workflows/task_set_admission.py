"""TaskSetAdmission: a set admitted as one unit, on the evidence of a seeded sample.

The execution loop's ``probe_admission`` runs on every sampled task (a few at a time);
governance judges each with the four questions, keeps it all on the set, and waits for
the operator's one decision (failing closed at the deadline, as a task's admission does).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, NexusOperationError

with workflow.unsafe.imports_passed_through():
    import governance_loop.contracts as m
    from governance_loop.gates import HumanDecisionError
    from governance_loop.workflows._shared import execution_loop, failure_chain, refusal
    from governance_loop.workflows.admission import PROBE_TIMEOUT
    from triloop.nexus_api import ExecutionService
    from triloop.statuses import TaskStatus
    from triloop.workflow_api import (
        ADMISSION_DECIDE_UPDATE,
        ADMISSION_STATUS_QUERY,
        TASK_SET_ADMISSION_WORKFLOW,
        AdmissionProbeInput,
        DecisionRef,
        ErrorType,
        TaskSetAdmissionInput,
        TaskSetAdmissionResult,
    )

# Sampled tasks probed at once: the execution loop's workers serve training too.
PROBES_AT_ONCE = 4


@workflow.defn(name=TASK_SET_ADMISSION_WORKFLOW)
class TaskSetAdmissionWorkflow:
    """A seeded sample probed, judged by the four questions; then one operator decision."""

    def __init__(self) -> None:
        self._result = TaskSetAdmissionResult(task_set_id="", status="assessing")
        self._decision: str | None = None
        self._deciding = False

    @workflow.query(name=ADMISSION_STATUS_QUERY)
    def status(self) -> TaskSetAdmissionResult:
        """The sample's assessment so far and the decision, if any."""
        return self._result

    @workflow.run
    async def run(self, request: TaskSetAdmissionInput) -> TaskSetAdmissionResult:
        """Probe the sample, store the evidence, then wait for the operator."""
        self._result.task_set_id = request.task_set_id
        plan = await m.LOAD_TASK_SET_ADMISSION.call(
            m.TaskSetAdmissionRequest(task_set_id=request.task_set_id))
        self._result.members = plan.members
        self._result.sample_seed = plan.sample_seed
        self._result.sample_size = len(plan.sample_task_ids)
        if plan.status != TaskStatus.pending or plan.problem:
            self._result.status = (plan.status if plan.status != TaskStatus.pending
                                   else TaskStatus.rejected)
            self._result.reasons = [plan.problem or f"task set is already {plan.status}"]
            return self._result
        probes: list[m.SampledProbe] = []
        for start in range(0, len(plan.sample_task_ids), PROBES_AT_ONCE):
            batch = plan.sample_task_ids[start:start + PROBES_AT_ONCE]
            probes += await asyncio.gather(*(self._probe(plan, task_id) for task_id in batch))
        assessment = await m.RECORD_TASK_SET_EVIDENCE.call(m.TaskSetEvidenceInput(
            task_set_id=request.task_set_id, sample_seed=plan.sample_seed, probes=probes))
        self._result.admissible = assessment.admissible
        self._result.failures = list(assessment.failures)
        self._result.reasons = list(assessment.reasons)
        self._result.status = "awaiting_decision"
        try:
            await workflow.wait_condition(lambda: self._decision is not None,
                                          timeout=timedelta(seconds=plan.decision_deadline_s))
        except TimeoutError:
            await workflow.wait_condition(lambda: not self._deciding)
        if self._decision is None:
            decided = await m.DECIDE_TASK_SET_ADMISSION.call(m.TaskSetDecisionInput(
                task_set_id=request.task_set_id,
                automatic_reason=f"no operator decision within {plan.decision_deadline_s:g}s",
            ))
            self._result.status = decided.status
            self._result.decided_by = decided.decided_by
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._result

    async def _probe(self, plan: m.TaskSetAdmissionPlan, task_id: str) -> m.SampledProbe:
        try:
            probe = await execution_loop().execute_operation(
                ExecutionService.probe_admission,
                AdmissionProbeInput(task_id=task_id, resets=plan.resets,
                                    reference_runs=plan.reference_runs),
                schedule_to_close_timeout=PROBE_TIMEOUT,
            )
        except NexusOperationError as failure:
            return m.SampledProbe(task_id=task_id, probe=None,
                                  probe_error=failure_chain(failure.cause or failure))
        return m.SampledProbe(task_id=task_id, probe=probe)

    @workflow.update(name=ADMISSION_DECIDE_UPDATE)
    async def decide_admission(self, decision: DecisionRef) -> TaskSetAdmissionResult:
        """An operator admits (only an admissible set) or rejects it, and its tasks with it."""
        # The web service lets a decision through once the evidence is on the set's row,
        # which the evidence activity writes a moment before this workflow learns it is
        # done: a decision arriving in between waits for the assessment, it is not refused.
        await workflow.wait_condition(
            lambda: self._result.status != "assessing" and not self._deciding)
        if self._result.status != "awaiting_decision":
            raise ApplicationError(
                f"refused: the task set's admission is {self._result.status}; no decision now",
                type=ErrorType.DECISION_REFUSED, non_retryable=True)
        self._deciding = True
        try:
            decided = await m.DECIDE_TASK_SET_ADMISSION.call(m.TaskSetDecisionInput(
                task_set_id=self._result.task_set_id, decision_id=decision.decision_id),
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
        if self._result.status not in ("assessing", "awaiting_decision"):
            raise HumanDecisionError(
                f"the task set's admission is {self._result.status}; no decision now")
        if not decision.decision_id:
            raise HumanDecisionError(
                "an admission decision is the id of the decision the web service recorded")
