"""Admission activities: prepare a task's assessment, store the evidence, record the decision.

The evidence itself is gathered by the execution loop (``probe_admission`` on its
queue); this side judges it with the pure ``assess_admission`` and keeps both on
the task row, so the operator and any later auditor see what was decided on.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sqlalchemy import Engine
from temporalio import activity

from governance_loop import store
from governance_loop.activity_support import GovernanceShell, record, refused
from governance_loop.admission import AdmissionBudgets, AdmissionEvidence, assess_admission
from governance_loop.contracts import (
    DECIDE_TASK_ADMISSION,
    LOAD_ADMISSION_TASK,
    RECORD_ADMISSION_EVIDENCE,
    AdmissionAssessmentRecord,
    AdmissionDecided,
    AdmissionDecisionInput,
    AdmissionEvidenceInput,
    AdmissionTask,
    AdmissionTaskRequest,
)
from triloop.db import session_scope
from triloop.models import DecisionKind, Task
from triloop.models._columns import utcnow
from triloop.policy import Authorizer, Resource
from triloop.statuses import Decision, TaskStatus
from triloop.workflow_api import AdmissionProbeEvidence


def judge_probe(
    task_id: str, probe: AdmissionProbeEvidence | None, probe_error: str | None, *,
    pinned_verifier_hash: str | None, budgets: AdmissionBudgets,
) -> dict[str, Any]:
    """One task's probe judged by the four questions: the probe, its error and the
    assessment as stored in the evidence (a task's, or a sampled task's in its set's)."""
    if probe is not None and probe.task_id != task_id:
        raise refused(f"probe evidence is for task {probe.task_id}, not {task_id}")
    evidence = AdmissionEvidence(
        reset_fingerprints=list(probe.reset_fingerprints) if probe else [],
        verifier_hash=probe.verifier_hash if probe else None,
        verifier_ran_out_of_process=probe.verifier_ran_out_of_process if probe else False,
        reset_seconds=list(probe.reset_seconds) if probe else [],
        reference_results=list(probe.reference_results) if probe else [],
        pinned_verifier_hash=pinned_verifier_hash,
        reward_hacks=list(probe.reward_hacks) if probe and probe.reward_hacks is not None
        else None,
    )
    assessment = assess_admission(evidence, budgets)
    reasons = list(assessment.reasons)
    admissible = assessment.admissible
    if probe_error:
        reasons.insert(0, f"probe failed: {probe_error}")
        admissible = False  # no evidence, no admission, whatever defaults would say
    return {
        "probe": asdict(probe) if probe else None,
        "probe_error": probe_error,
        "assessment": {
            "reproducible": assessment.reproducible, "verifiable": assessment.verifiable,
            "cheap_recovery": assessment.cheap_recovery,
            "repeatable": assessment.repeatable, "admissible": admissible,
            "reasons": reasons, "evidence": assessment.evidence,
        },
    }


class AdmissionActivities(GovernanceShell):
    """Task admission: evidence and the operator's decision on the task row."""

    def __init__(
        self,
        engine: Engine,
        authorizer: Authorizer,
        *,
        budgets: AdmissionBudgets | None = None,
        decision_deadline_s: float,
    ) -> None:
        super().__init__(engine, authorizer)
        self._budgets = budgets or AdmissionBudgets()
        self._deadline_s = decision_deadline_s

    @activity.defn(name=LOAD_ADMISSION_TASK.name)
    def load_admission_task(self, request: AdmissionTaskRequest) -> AdmissionTask:
        """The task's state and how much evidence the probe must gather."""
        with session_scope(self._engine) as session:
            task = store.get_task(session=session, task_id=request.task_id)
            version = store.get_environment_version(
                session=session, version_id=task.environment_version_id
            )
        problem = None
        if version.retired_at is not None:
            problem = (f"environment version {version.environment_name} v{version.version} is "
                       "retired: no new tasks are admitted on it")
        return AdmissionTask(
            task_id=task.id, status=task.status, resets=self._budgets.min_resets,
            reference_runs=self._budgets.repeat_k, decision_deadline_s=self._deadline_s,
            problem=problem,
        )

    @activity.defn(name=RECORD_ADMISSION_EVIDENCE.name)
    def record_admission_evidence(
        self, request: AdmissionEvidenceInput
    ) -> AdmissionAssessmentRecord:
        """Judge the probe's evidence with the four questions and keep both on the task."""
        with session_scope(self._engine) as session:
            task = store.get_task(session=session, task_id=request.task_id)
            version = store.get_environment_version(
                session=session, version_id=task.environment_version_id
            )
            pinned_verifier_hash = version.verifier_hash
        stored = judge_probe(request.task_id, request.probe, request.probe_error,
                             pinned_verifier_hash=pinned_verifier_hash, budgets=self._budgets)
        admissible, reasons = stored["assessment"]["admissible"], stored["assessment"]["reasons"]
        self.authorize("update", Resource("task", id=request.task_id,
                                          attrs={"admissible": admissible}))
        with session_scope(self._engine) as session:
            task = store.get_task(session=session, task_id=request.task_id, for_update=True)
            if task.status != TaskStatus.pending:
                raise refused(f"task {task.id} is already {task.status}")
            task.evidence = {**stored, "assessed_at": utcnow().isoformat()}
            _record_content(task, request.probe)
            session.add(task)
            record(session, action="assess_task", resource={"kind": "task", "id": task.id},
                   payload={"admissible": admissible, "reasons": reasons})
        return AdmissionAssessmentRecord(admissible=admissible, reasons=reasons)

    @activity.defn(name=DECIDE_TASK_ADMISSION.name)
    def decide_task_admission(self, request: AdmissionDecisionInput) -> AdmissionDecided:
        """Admit (only an admissible task) or reject; returns the task's new status."""
        resource = Resource("task", id=request.task_id)
        if request.decision_id:  # an operator's: proven from the row the web service wrote
            proven = self.prove(request.decision_id, DecisionKind.ADMISSION, request.task_id,
                                role="operator", resource=resource)
            decided_by, decision, comment = proven.user, proven.decision, proven.comment
        else:  # the automatic rejection at the deadline is governance's own act
            proven, decided_by, decision = None, "governance", Decision.REJECT
            comment = request.automatic_reason
        if decision not in (Decision.APPROVE, Decision.REJECT):
            raise refused(f"unknown decision {decision!r}: approve or reject")
        if not comment.strip():
            raise refused("an admission decision needs a comment saying why")
        admit = decision == Decision.APPROVE
        with session_scope(self._engine) as session:
            task = store.get_task(session=session, task_id=request.task_id)
            assessment = (task.evidence or {}).get("assessment") or {}
        if admit and assessment.get("admissible") is not True:
            raise refused(f"task {request.task_id} is not admissible; it can only be rejected")
        action = "admit" if admit else "reject_task"
        resource = Resource("task", id=request.task_id, attrs={"admissible": admit})
        if proven is not None:
            self.authorize_for(proven, action, resource)
        else:
            self.authorize(action, resource, context={"comment": comment})
        status = TaskStatus.admitted if admit else TaskStatus.rejected
        with session_scope(self._engine) as session:
            task = store.get_task(session=session, task_id=request.task_id, for_update=True)
            if task.status not in (TaskStatus.pending, status):
                raise refused(f"task {task.id} is already {task.status}")
            task.status = status
            task.decided_by = decided_by
            task.decided_at = utcnow()
            task.evidence = {**(task.evidence or {}),
                             "decision": {"user": decided_by, "decision": decision,
                                          "comment": comment,
                                          "human_decision_id": request.decision_id or None}}
            session.add(task)
            record(session, action=f"task_{status}", resource={"kind": "task", "id": task.id},
                   payload={"decided_by": decided_by, "comment": comment,
                            "human_decision_id": request.decision_id or None})
        return AdmissionDecided(status=status, decided_by=decided_by, decision=decision)


def _record_content(task: Task, probe: AdmissionProbeEvidence | None) -> None:
    """The probe's content digest and tags on the task, so held out by content covers a
    single task too. A digest already recorded (a task set's member's) is never changed:
    the member rows point at it; the environment's tags never override the set's."""
    if probe is None or probe.content_digest is None:
        return
    if task.content_digest is None:
        task.content_digest = probe.content_digest
    task.tags = {**probe.tags, **(task.tags or {})}
