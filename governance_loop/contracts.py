"""Names and one-in/one-out dataclasses of the governance activities.

Workflows import this module (never the activity classes), so it imports no
database, HTTP or policy code: only the wire contract and the standard library.
Timestamps travel as ISO-8601 strings taken from the database clock, because
episode rows are stamped by that clock and gate windows must match them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

from governance_loop.durations import PromotionTiming
from triloop.activity_contract import ActivityContract
from triloop.statuses import Gate
from triloop.workflow_api import (
    AdmissionProbeEvidence,
    DescribeTasksInput,
    DescribeTasksResult,
    ErrorType,
    GovernanceWriteInput,
    GovernanceWriteResult,
    RollbackInput,
    RollbackResult,
    RolloutBatchInput,
    RolloutItem,
    StabilityAlarm,
)


@dataclass
class TaskSetStoreInput:
    """Write a registered task set: the operator's decision and what execution described."""

    request: GovernanceWriteInput
    described: DescribeTasksResult


@dataclass
class OpenPromotionInput:
    """Open (or find) the promotion of a proposal."""

    proposal_id: str
    checkpoint_id: str
    run_id: str
    submitted_by: str  # as the proposer claims it; the run row decides
    workflow_id: str
    # The run's alarms as the proposal's workflow input carried them (compared, not trusted).
    stability_alarms: list[StabilityAlarm] = field(default_factory=list)


@dataclass
class PromotionPlan:
    """What a promotion compares and with which rules, read once when it opens."""

    promotion_id: str
    submitted_by: str  # from the training run row, not from the proposer
    candidate_checkpoint_id: str
    baseline_checkpoint_id: str | None
    opened_at: str
    timing: PromotionTiming
    threshold_id: str | None = None
    eval_set_id: str | None = None  # the first of eval_set_ids (plans before them: the only)
    eval_items: list[RolloutItem] = field(default_factory=list)  # every set's, each task once
    problem: str | None = None  # why the promotion cannot be evaluated at all
    # The eval sets of the environments the candidate was trained on (it must pass each).
    eval_set_ids: list[str] = field(default_factory=list)
    # The stability gate, judged when the promotion opens: pass | fail (stored in
    # ``stability_gate_result_id``) or continue (blocked until an operator overrides).
    # None: not judged (no threshold to judge by, or a promotion opened before the gate).
    stability_verdict: str | None = None
    stability_reasons: list[str] = field(default_factory=list)
    stability_gate_result_id: str | None = None
    # The placebo control (issue 27), when the threshold requires it for the alias the
    # promotion moves: the placebo run and its last checkpoint, which offline eval plays as
    # a third arm (None: no placebo run was found; the gate then fails naming the command).
    placebo_required: bool = False
    placebo_run_id: str | None = None
    placebo_checkpoint_id: str | None = None


@dataclass
class MarkPromotion:
    """Move the promotion row to a gate and/or a status."""

    promotion_id: str
    gate: str | None = None
    status: str | None = None
    reason: str | None = None


@dataclass
class GateRecord:
    """A gate verdict the workflow itself reached (expired deadline, unmet precondition)."""

    promotion_id: str
    gate: str
    reasons: list[str]
    verdict: str = "fail"
    threshold_id: str | None = None
    eval_set_id: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class GateOutcome:
    """A gate's verdict as the workflow needs it; the evidence is in ``gate_result``."""

    gate: str
    passed: bool
    verdict: str  # pass | fail | continue | abort_regression | rollback
    reasons: list[str] = field(default_factory=list)
    gate_result_id: str | None = None
    restore_routing: bool = False
    rollback: bool = False
    decided_by: str | None = None  # audit and approval: the person, read from the database


@dataclass
class OfflineEvalInput:
    """Candidate and production eval batches to judge against a threshold version."""

    promotion_id: str
    threshold_id: str
    eval_set_id: str
    candidate_batch_id: str
    production_batch_id: str | None
    batch_errors: list[str] = field(default_factory=list)
    # Every eval set judged (the batches play all their tasks); empty: ``eval_set_id`` alone.
    eval_set_ids: list[str] = field(default_factory=list)
    # The placebo arm (``PromotionPlan.placebo_*``): its batch, governance's like the others.
    # Whether it is required is the threshold's to say (``placebo``), read by the judge.
    placebo_run_id: str | None = None
    placebo_checkpoint_id: str | None = None
    placebo_batch_id: str | None = None


@dataclass
class ClosePromotion:
    """A promotion's run ends early (cancelled, failed): free its slots, record the status."""

    promotion_id: str
    status: str  # PromotionStatus: cancelled | failed
    reason: str = ""


@dataclass
class RoutingRequest:
    """Point a routing slot at a checkpoint for a promotion, or release it (None)."""

    promotion_id: str
    slot: str  # shadow | canary
    checkpoint_id: str | None
    share: float = 0.0


@dataclass
class RoutingChange:
    """Whether the slot is ours now, since when (database clock), and who holds it if not."""

    ok: bool
    at: str
    holder: str | None = None


@dataclass
class ShadowInput:
    """Judge the shadow soak: candidate shadows of production episodes since ``since``."""

    promotion_id: str
    threshold_id: str
    candidate_checkpoint_id: str
    production_checkpoint_id: str
    since: str


@dataclass
class CanaryLook:
    """One look of the canary's sequential test."""

    promotion_id: str
    threshold_id: str
    candidate_checkpoint_id: str
    production_checkpoint_id: str
    since: str
    soak_complete: bool
    # 1 for the first look; 0 from histories recorded before looks were counted.
    look: int = 0


@dataclass
class HumanDecisionRecord:
    """Carry out a person's audit or approval decision: its ``human_decision`` row id.

    Who decided, what and why are read from that row, their roles from ``app_user``.
    """

    promotion_id: str
    gate: Gate  # audit | approval | stability
    decision_id: str
    submitted_by: str
    audited_by: str | None = None  # the auditor who signed (approval decisions)


@dataclass
class PromoteInput:
    """Move production to the candidate; the audit and the approval name two other people."""

    promotion_id: str
    candidate_checkpoint_id: str
    baseline_checkpoint_id: str
    submitted_by: str
    audited_by: str
    approved_by: str


@dataclass
class PromoteResult:
    """The promote gate's outcome and, when the alias moved, when (database clock)."""

    outcome: GateOutcome
    promoted_at: str | None = None


@dataclass
class WatchLook:
    """One look of the post-promotion watch against the pre-promotion baseline."""

    promotion_id: str
    threshold_id: str
    candidate_checkpoint_id: str
    baseline_checkpoint_id: str
    baseline_since: str  # baseline episodes are production's from here to promoted_at
    promoted_at: str
    period_complete: bool
    # 1 for the first look; 0 from histories recorded before looks were counted.
    look: int = 0


@dataclass
class AdmissionTaskRequest:
    """Which task to prepare an admission for."""

    task_id: str


@dataclass
class AdmissionTask:
    """A task about to be assessed, with the budgets the probe must gather evidence for."""

    task_id: str
    status: str
    resets: int
    reference_runs: int
    decision_deadline_s: float
    problem: str | None = None  # e.g. the environment version is retired


@dataclass
class AdmissionEvidenceInput:
    """What the execution loop's probe observed (or why it could not)."""

    task_id: str
    probe: AdmissionProbeEvidence | None
    probe_error: str | None = None


@dataclass
class AdmissionAssessmentRecord:
    """The four answers as stored on the task row."""

    admissible: bool
    reasons: list[str]


@dataclass
class AdmissionDecisionInput:
    """Admit or reject a task: an operator's recorded decision, or governance's own rejection.

    ``decision_id`` names the operator's ``human_decision`` row (who, what and why are read
    from it); without one, ``automatic_reason`` says why governance rejects on its own.
    """

    task_id: str
    decision_id: str = ""
    automatic_reason: str = ""


@dataclass
class AdmissionDecided:
    """The task's new status and who decided (a person, or governance)."""

    status: str
    decided_by: str
    decision: str  # approve | reject


@dataclass
class TaskSetAdmissionRequest:
    """Which task set to prepare an admission for."""

    task_set_id: str


@dataclass
class TaskSetAdmissionPlan:
    """A task set about to be assessed: its seeded sample and the probe's budgets."""

    task_set_id: str
    status: str
    members: int
    sample_seed: int
    sample_task_ids: list[str]
    resets: int
    reference_runs: int
    decision_deadline_s: float
    problem: str | None = None  # e.g. the environment version is retired, no members


@dataclass
class SampledProbe:
    """What the execution loop's probe observed for one sampled task (or why it could not)."""

    task_id: str
    probe: AdmissionProbeEvidence | None
    probe_error: str | None = None


@dataclass
class TaskSetEvidenceInput:
    """Every sampled task's probe, to judge and keep on the task set."""

    task_set_id: str
    sample_seed: int
    probes: list[SampledProbe]


@dataclass
class TaskSetAssessmentRecord:
    """The set's verdict as stored on its row: admissible only if every sampled task is."""

    admissible: bool
    failures: list[str]  # "<task id>: <question>: failed, ..." per failed answer
    reasons: list[str]


@dataclass
class TaskSetDecisionInput:
    """Admit or reject a task set: an operator's recorded decision, or governance's own
    rejection at the deadline (``automatic_reason``)."""

    task_set_id: str
    decision_id: str = ""
    automatic_reason: str = ""


@dataclass
class TaskSetDecided:
    """The set's new status, who decided, and how many member tasks changed with it."""

    status: str
    decided_by: str
    decision: str  # approve | reject
    tasks_changed: int = 0


# Every governance activity is short database (and OPA) work on the governance queue.
# OPA's refusals and the loop's own rules are never retried; an unreachable OPA is.
QUICK = timedelta(seconds=60)
NEVER_RETRIED = [ErrorType.POLICY_DENIED, ErrorType.GOVERNANCE_REFUSED,
                 ErrorType.PROMOTION_REFUSED]
RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30),
                    non_retryable_error_types=NEVER_RETRIED)
# A person waits on an update or a write: fail fast instead of retrying for minutes.
HUMAN_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3,
                          non_retryable_error_types=NEVER_RETRIED)
# A write that cannot be stored as asked (a bad contract or threshold spec) stays refused.
WRITE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5,
                          non_retryable_error_types=[*NEVER_RETRIED, ErrorType.INVALID_REQUEST])


def _quick(name: str, arg: type[Any], out: type[Any], retry: RetryPolicy = RETRY) -> Any:
    # Before the one naming scheme these were "governance_<name>" on the wire.
    return ActivityContract(f"governance.{name}", arg, out, QUICK, retry,
                            legacy_name=f"governance_{name}")


OPEN_PROMOTION: ActivityContract[OpenPromotionInput, PromotionPlan] = _quick(
    "open_promotion", OpenPromotionInput, PromotionPlan)
MARK_PROMOTION: ActivityContract[MarkPromotion, None] = _quick(
    "mark_promotion", MarkPromotion, type(None))
RECORD_GATE: ActivityContract[GateRecord, GateOutcome] = _quick(
    "record_gate", GateRecord, GateOutcome)
# Governance's own row for an eval batch, planned episodes included, before it asks for it.
RECORD_ROLLOUT_BATCH: ActivityContract[RolloutBatchInput, None] = ActivityContract(
    "governance.record_rollout_batch", RolloutBatchInput, type(None), QUICK, RETRY)
DECIDE_OFFLINE_EVAL: ActivityContract[OfflineEvalInput, GateOutcome] = _quick(
    "decide_offline_eval", OfflineEvalInput, GateOutcome)
SET_ROUTING: ActivityContract[RoutingRequest, RoutingChange] = _quick(
    "set_routing", RoutingRequest, RoutingChange)
CLOSE_PROMOTION: ActivityContract[ClosePromotion, None] = ActivityContract(
    "governance.close_promotion", ClosePromotion, type(None), QUICK, RETRY)
DECIDE_SHADOW: ActivityContract[ShadowInput, GateOutcome] = _quick(
    "decide_shadow", ShadowInput, GateOutcome)
LOOK_CANARY: ActivityContract[CanaryLook, GateOutcome] = _quick(
    "look_canary", CanaryLook, GateOutcome)
RECORD_HUMAN_DECISION: ActivityContract[HumanDecisionRecord, GateOutcome] = _quick(
    "record_human_decision", HumanDecisionRecord, GateOutcome, HUMAN_RETRY)
PROMOTE_CANDIDATE: ActivityContract[PromoteInput, PromoteResult] = _quick(
    "promote_candidate", PromoteInput, PromoteResult)
LOOK_WATCH: ActivityContract[WatchLook, GateOutcome] = _quick(
    "look_watch", WatchLook, GateOutcome)
ROLLBACK_DEPLOYMENT: ActivityContract[RollbackInput, RollbackResult] = _quick(
    "rollback_deployment", RollbackInput, RollbackResult)
LOAD_ADMISSION_TASK: ActivityContract[AdmissionTaskRequest, AdmissionTask] = _quick(
    "load_admission_task", AdmissionTaskRequest, AdmissionTask)
RECORD_ADMISSION_EVIDENCE: ActivityContract[
    AdmissionEvidenceInput, AdmissionAssessmentRecord] = _quick(
    "record_admission_evidence", AdmissionEvidenceInput, AdmissionAssessmentRecord)
DECIDE_TASK_ADMISSION: ActivityContract[AdmissionDecisionInput, AdmissionDecided] = _quick(
    "decide_task_admission", AdmissionDecisionInput, AdmissionDecided)
# A task set's admission (issue 26): born under the one naming scheme, no legacy name.
LOAD_TASK_SET_ADMISSION: ActivityContract[TaskSetAdmissionRequest, TaskSetAdmissionPlan] = (
    ActivityContract("governance.load_task_set_admission", TaskSetAdmissionRequest,
                     TaskSetAdmissionPlan, QUICK, RETRY))
RECORD_TASK_SET_EVIDENCE: ActivityContract[TaskSetEvidenceInput, TaskSetAssessmentRecord] = (
    ActivityContract("governance.record_task_set_evidence", TaskSetEvidenceInput,
                     TaskSetAssessmentRecord, QUICK, RETRY))
DECIDE_TASK_SET_ADMISSION: ActivityContract[TaskSetDecisionInput, TaskSetDecided] = (
    ActivityContract("governance.decide_task_set_admission", TaskSetDecisionInput,
                     TaskSetDecided, QUICK, RETRY))
# A person's recorded write, by the decision's kind.
REGISTER_ENVIRONMENT_VERSION: ActivityContract[
    GovernanceWriteInput, GovernanceWriteResult] = _quick(
    "register_environment_version", GovernanceWriteInput, GovernanceWriteResult, WRITE_RETRY)
CREATE_EVAL_SET: ActivityContract[GovernanceWriteInput, GovernanceWriteResult] = _quick(
    "create_eval_set", GovernanceWriteInput, GovernanceWriteResult, WRITE_RETRY)
SET_THRESHOLD: ActivityContract[GovernanceWriteInput, GovernanceWriteResult] = _quick(
    "set_threshold", GovernanceWriteInput, GovernanceWriteResult, WRITE_RETRY)
# A task set's registration: check the decision and name what to describe, then write it.
# Writing reads a dataset back from the artifact store and may write thousands of rows.
PREPARE_TASK_SET: ActivityContract[GovernanceWriteInput, DescribeTasksInput] = ActivityContract(
    "governance.prepare_task_set", GovernanceWriteInput, DescribeTasksInput, QUICK, WRITE_RETRY)
STORE_TASK_SET: ActivityContract[TaskSetStoreInput, GovernanceWriteResult] = ActivityContract(
    "governance.store_task_set", TaskSetStoreInput, GovernanceWriteResult,
    timedelta(minutes=10), WRITE_RETRY)
