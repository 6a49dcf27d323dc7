"""A task set's admission: draw its seeded sample, judge each probe, record one decision.

The four questions and the reward-hack probes are the per-task admission's
(``judge_probe``), answered on a sample of the set's tasks (``sample_tasks``, sized by the
``set_sample`` budget). The set is admissible only when every sampled task is; what was
sampled, with which seed, each sampled task's assessment and the failures are kept on
``task_set.evidence``. The operator's one decision then sets the set's status and every
pending member task's, in one transaction.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine, text
from sqlmodel import Session, col, select
from temporalio import activity

from governance_loop import store
from governance_loop.activities.admission import judge_probe
from governance_loop.activity_support import GovernanceShell, record, refused
from governance_loop.admission import AdmissionBudgets, sample_seed, sample_tasks
from governance_loop.contracts import (
    DECIDE_TASK_SET_ADMISSION,
    LOAD_TASK_SET_ADMISSION,
    RECORD_TASK_SET_EVIDENCE,
    TaskSetAdmissionPlan,
    TaskSetAdmissionRequest,
    TaskSetAssessmentRecord,
    TaskSetDecided,
    TaskSetDecisionInput,
    TaskSetEvidenceInput,
)
from triloop.db import session_scope
from triloop.models import DecisionKind, TaskSet, TaskSetMember
from triloop.models._columns import utcnow
from triloop.policy import Authorizer, Resource
from triloop.statuses import Decision, TaskStatus

# How many refused members a refusal names before it says "and N more".
NAMED = 10

_REJECTED_MEMBERS = text("""
    SELECT t.id FROM task t JOIN task_set_member m ON m.task_id = t.id
    WHERE m.task_set_id = :set AND t.status = 'rejected' ORDER BY m.ordinal
""")
# Pending members only: a task another decision admitted (a single task, another set) keeps
# its status and its own evidence.
_SET_MEMBER_TASKS = text("""
    WITH changed AS (
        UPDATE task SET status = :status, decided_by = :user, decided_at = now(),
            evidence = coalesce(evidence, '{}'::jsonb)
                || jsonb_build_object('task_set_admission', CAST(:why AS jsonb))
        WHERE status = 'pending'
          AND id IN (SELECT task_id FROM task_set_member WHERE task_set_id = :set)
        RETURNING 1)
    SELECT count(*) FROM changed
""")


def _task_set(session: Session, task_set_id: str, *, for_update: bool = False) -> TaskSet:
    query = select(TaskSet).where(TaskSet.id == task_set_id)
    row = session.exec(query.with_for_update() if for_update else query).first()
    if row is None:
        raise refused(f"task set {task_set_id} does not exist")
    return row


def _members(session: Session, task_set_id: str) -> list[TaskSetMember]:
    return list(session.exec(select(TaskSetMember)
                             .where(TaskSetMember.task_set_id == task_set_id)
                             .order_by(col(TaskSetMember.ordinal))))


def _named(ids: list[str]) -> str:
    more = f" and {len(ids) - NAMED} more" if len(ids) > NAMED else ""
    return ", ".join(ids[:NAMED]) + more


class TaskSetAdmissionActivities(GovernanceShell):
    """A task set's admission: evidence and the operator's decision on the task set row."""

    def __init__(
        self, engine: Engine, authorizer: Authorizer, *, budgets: AdmissionBudgets | None = None,
        decision_deadline_s: float,
    ) -> None:
        super().__init__(engine, authorizer)
        self._budgets = budgets or AdmissionBudgets()
        self._deadline_s = decision_deadline_s

    def _sample(self, task_set_id: str, members: list[TaskSetMember]) -> tuple[int, list[str]]:
        seed = sample_seed(task_set_id)
        return seed, sample_tasks([m.task_id for m in members], seed=seed,
                                  size=self._budgets.set_sample)

    @activity.defn(name=LOAD_TASK_SET_ADMISSION.name)
    def load_task_set_admission(self, request: TaskSetAdmissionRequest) -> TaskSetAdmissionPlan:
        """The set's state, its seeded sample and how much evidence each probe must gather."""
        with session_scope(self._engine) as session:
            task_set = _task_set(session, request.task_set_id)
            version = store.get_environment_version(
                session=session, version_id=task_set.environment_version_id)
            members = _members(session, task_set.id)
        seed, sample = self._sample(task_set.id, members)
        problem = None
        if version.retired_at is not None:
            problem = (f"environment version {version.environment_name} v{version.version} is "
                       "retired: no new tasks are admitted on it")
        elif not members:
            problem = f"task set {task_set.name} v{task_set.version} has no tasks"
        return TaskSetAdmissionPlan(
            task_set_id=task_set.id, status=task_set.status, members=len(members),
            sample_seed=seed, sample_task_ids=sample, resets=self._budgets.min_resets,
            reference_runs=self._budgets.repeat_k, decision_deadline_s=self._deadline_s,
            problem=problem)

    @activity.defn(name=RECORD_TASK_SET_EVIDENCE.name)
    def record_task_set_evidence(self, request: TaskSetEvidenceInput) -> TaskSetAssessmentRecord:
        """Judge each sampled task's probe and keep the sample, the assessments and the
        failures on the task set; the set is admissible only if every sampled task is."""
        with session_scope(self._engine) as session:
            task_set = _task_set(session, request.task_set_id)
            version = store.get_environment_version(
                session=session, version_id=task_set.environment_version_id)
            members = _members(session, task_set.id)
        seed, sample = self._sample(task_set.id, members)
        probed = [p.task_id for p in request.probes]
        # The evidence must be for the sample anyone can draw again from the seed.
        if request.sample_seed != seed or probed != sample:
            raise refused(f"the probes are for tasks {_named(probed)} (seed"
                          f" {request.sample_seed}), not task set {task_set.id}'s sample"
                          f" {_named(sample)} (seed {seed})")
        by_task = {m.task_id: m for m in members}
        assessed: list[dict[str, Any]] = []
        failures: list[str] = []
        passed = 0
        for probe in request.probes:
            judged = judge_probe(probe.task_id, probe.probe, probe.probe_error,
                                 pinned_verifier_hash=version.verifier_hash,
                                 budgets=self._budgets)
            member = by_task[probe.task_id]
            assessed.append({"task_id": probe.task_id, "ordinal": member.ordinal,
                             "split": member.split, **judged})
            verdict = judged["assessment"]
            passed += bool(verdict["admissible"])
            if not verdict["admissible"]:
                failures += [f"{probe.task_id}: {reason}" for reason in verdict["reasons"]
                             if "failed" in reason.split(",")[0]]
        admissible = passed == len(sample)
        reasons = [f"{len(sample)} of {len(members)} task(s) sampled with seed {seed}",
                   f"{passed} of {len(sample)} sampled task(s) admissible"]
        evidence = {
            "sample": {"size": len(sample), "seed": seed, "members": len(members),
                       "budget": self._budgets.set_sample, "task_ids": sample},
            "tasks": assessed, "failures": failures, "admissible": admissible,
            "reasons": reasons, "assessed_at": utcnow().isoformat(),
        }
        self.authorize("update", Resource("task_set", id=task_set.id,
                                          attrs={"admissible": admissible}))
        with session_scope(self._engine) as session:
            row = _task_set(session, task_set.id, for_update=True)
            if row.status != TaskStatus.pending:
                raise refused(f"task set {row.id} is already {row.status}")
            row.evidence = evidence
            session.add(row)
            record(session, action="assess_task_set",
                   resource={"kind": "task_set", "id": row.id},
                   payload={"admissible": admissible, "sample_size": len(sample),
                            "sample_seed": seed, "failures": failures})
        return TaskSetAssessmentRecord(admissible=admissible, failures=failures,
                                       reasons=reasons)

    @activity.defn(name=DECIDE_TASK_SET_ADMISSION.name)
    def decide_task_set_admission(self, request: TaskSetDecisionInput) -> TaskSetDecided:
        """Admit (only an admissible set) or reject, with every pending member task."""
        resource = Resource("task_set", id=request.task_set_id)
        if request.decision_id:  # an operator's: proven from the row the web service wrote
            proven = self.prove(request.decision_id, DecisionKind.TASK_SET_ADMISSION,
                                request.task_set_id, role="operator", resource=resource)
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
            task_set = _task_set(session, request.task_set_id)
            admissible = (task_set.evidence or {}).get("admissible")
            rejected = (list(session.execute(_REJECTED_MEMBERS, {"set": task_set.id}).scalars())
                        if admit else [])
        if admit and admissible is not True:
            raise refused(f"task set {request.task_set_id} is not admissible; it can only be"
                          " rejected")
        if rejected:
            raise refused(f"task set {request.task_set_id} holds rejected task(s)"
                          f" {_named(rejected)}; it can only be rejected")
        action = "admit" if admit else "reject"
        resource = Resource("task_set", id=request.task_set_id, attrs={"admissible": admit})
        if proven is not None:
            self.authorize_for(proven, action, resource)
        else:
            self.authorize(action, resource, context={"comment": comment})
        status = TaskStatus.admitted if admit else TaskStatus.rejected
        why = {"task_set_id": request.task_set_id, "decision": decision, "user": decided_by,
               "human_decision_id": request.decision_id or None}
        with session_scope(self._engine) as session:
            row = _task_set(session, request.task_set_id, for_update=True)
            if row.status != TaskStatus.pending:
                raise refused(f"task set {row.id} is already {row.status}")
            row.status, row.decided_by, row.decided_at = status, decided_by, utcnow()
            row.evidence = {**(row.evidence or {}),
                            "decision": {"user": decided_by, "decision": decision,
                                         "comment": comment,
                                         "human_decision_id": request.decision_id or None}}
            session.add(row)
            session.flush()
            changed = int(session.execute(_SET_MEMBER_TASKS, {
                "status": status.value, "user": decided_by, "set": row.id,
                "why": json.dumps(why)}).scalar_one())
            record(session, action=f"task_set_{status}",
                   resource={"kind": "task_set", "id": row.id},
                   payload={"decided_by": decided_by, "comment": comment,
                            "tasks_changed": changed,
                            "human_decision_id": request.decision_id or None})
        return TaskSetDecided(status=status, decided_by=decided_by, decision=decision,
                              tasks_changed=changed)
