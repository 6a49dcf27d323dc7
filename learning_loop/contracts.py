"""The learning loop's activities: each one's input, output, timeout and retry.

The dataclasses are the messages, one in and one out; the ``ActivityContract`` constants
at the end name each activity once, for the workflow that calls it
(``await VALIDATE_RUN.call(...)``) and the class that implements it
(``@activity.defn(name=VALIDATE_RUN.name)``).

Torch-free and database-free so ``learning_loop.workflows`` can import it inside the
workflow sandbox. Fields may be added later (with defaults) without breaking histories.
No ``from __future__ import annotations``: the payload converter resolves field types
with ``get_type_hints``, which cannot see this module's globals from inside the sandbox.
"""

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

from triloop.activity_contract import ActivityContract
from triloop.run_config import RunConfig
from triloop.workflow_api import ModelImportInput, ModelImportResult, StabilityAlarm

# Error types raised as non-retryable ApplicationErrors (the workflow reports them as is).
RUN_NOT_FOUND = "RunNotFound"
TASK_NOT_ADMITTED = "TaskNotAdmitted"
BASE_MODEL_NOT_FOUND = "BaseModelNotFound"
INVALID_TRAINING_DATA = "InvalidTrainingData"
CHECKPOINT_BROKEN = "CheckpointBroken"
CHECKPOINT_PRUNED = "CheckpointPruned"  # its weights were deleted by retention (names the rule)
RANK_FAILED = "RankFailed"  # a rank of a multi-rank update failed (names it, quotes its log)


@dataclass
class ValidateRunInput:
    """Check that a run exists as submitted and that every task is admitted."""

    run_id: str
    submitted_by: str
    task_ids: list[str]


@dataclass
class TaskSeed:
    """An admitted task and the seed it was admitted with."""

    task_id: str
    seed: int
    environment_version_id: str
    environment: str = ""  # the environment's name (per-environment metrics, normalisation)
    # ``task.tags`` (domain, capability, difficulty, ...): per-tag series and the curriculum.
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class RunPlan:
    """What the run may train on."""

    tasks: list[TaskSeed] = field(default_factory=list)
    environment_version_ids: list[str] = field(default_factory=list)


@dataclass
class RunStatusInput:
    """Record a run's status (and how far it got) on its ``training_run`` row."""

    run_id: str
    status: str  # running | paused | completed | completed_with_alarms | cancelled | failed
    reason: str | None = None
    # "update" for the loop's own bookkeeping, "pause" when a stability alarm pauses it.
    action: str = "update"


@dataclass
class ControlInput:
    """A person's pause/resume/cancel: the id of the decision the web service recorded.

    The activity reads who asked, and why, from that row and asks the policy again.
    """

    run_id: str
    action: str  # pause | resume | cancel (the signal it came by)
    decision_id: str = ""


@dataclass
class ControlDecision:
    """Whether the request went through, and why not; who asked, read from the database."""

    accepted: bool
    reason: str = ""
    user: str = ""


@dataclass
class RegisterBaseInput:
    """Register the run's base model as a root checkpoint (no parent) if it is not yet."""

    run_id: str
    base: str  # a model directory, or the id of a registered checkpoint


@dataclass
class BaseCheckpoint:
    """The root checkpoint of the run's lineage."""

    checkpoint_id: str
    created: bool


@dataclass
class UpdateInput:
    """One iteration's policy update: parent checkpoint + rollout batches -> child checkpoint."""

    run_id: str
    iteration: int  # 1-based; the child checkpoint is policy version ``iteration``
    parent_checkpoint_id: str  # policy version ``iteration - 1``
    base_checkpoint_id: str  # root of the lineage (and the KL reference)
    batch_ids: list[str]
    config: RunConfig  # the run's, as the web service validated it
    environment_version_ids: list[str] = field(default_factory=list)
    # The run's admitted training tasks -> their environment's name. The learner refuses a
    # trajectory of any other task (empty: an update started before this field existed).
    task_environments: dict[str, str] = field(default_factory=dict)
    # The run's tagged training tasks -> their tags, for the per-tag series.
    task_tags: dict[str, dict[str, str]] = field(default_factory=dict)
    # Metric keys the workflow knows of the iteration (resample rounds, tasks filtered by
    # pass rate, the curriculum's max_turns), stored with the iteration's series.
    series: dict[str, float] = field(default_factory=dict)
    # Mitigations so far (learning_loop.mitigation): added to objective.entropy_coef, and
    # multiplying optimizer.learning_rate (unitless).
    entropy_coef_bonus: float = 0.0
    learning_rate_scale: float = 1.0
    # Partial rollouts (learning_loop.partial_rollouts): groups of batch_ids that wait for
    # a continuation, and groups of earlier batches whose continuations finished.
    held_group_ids: list[str] = field(default_factory=list)
    carried_group_ids: list[str] = field(default_factory=list)
    # Retention: checkpoints the run still serves besides the parent (its rollouts in
    # flight), which the prune after this update must keep whatever their age.
    retain_checkpoint_ids: list[str] = field(default_factory=list)


@dataclass
class AlarmReport:
    """A stability alarm raised by an update (also stored and audited)."""

    kind: str  # echo_trap | template_collapse
    message: str


@dataclass
class UpdateResult:
    """The iteration as stored: its checkpoint, headline metrics and alarms."""

    iteration: int
    checkpoint_id: str
    reward_mean: float | None = None
    loss: float | None = None
    samples: int = 0
    alarms: list[AlarmReport] = field(default_factory=list)
    # True when an earlier attempt had already stored this iteration (idempotent retry).
    already_done: bool = False


@dataclass
class ProposeInput:
    """Propose a checkpoint to governance: a ``proposal`` row and a signal-with-start."""

    run_id: str
    iteration: int
    checkpoint_id: str
    submitted_by: str
    governance_queue: str
    base_checkpoint_id: str | None = None


@dataclass
class ProposeResult:
    """The proposal, the promotion workflow that will hold it, and the run's alarms so far."""

    proposal_id: str
    promotion_workflow_id: str
    stability_alarms: list[StabilityAlarm] = field(default_factory=list)


@dataclass
class MitigationInput:
    """A mitigation the run takes on an alarm, to authorize and audit before it acts."""

    run_id: str
    iteration: int  # the iteration that alarmed
    kind: str  # raise_entropy | lower_learning_rate | rollback
    alarms: list[str] = field(default_factory=list)  # the alarms' messages
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class MitigationRecorded:
    """The mitigation was allowed and its audit event written."""

    recorded: bool = True


# Light activities on the ``learning`` queue: short database work, retried a while.
LIGHT_TIMEOUT = timedelta(seconds=60)
LIGHT_RETRY = RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=20))
VALIDATE_RUN = ActivityContract(
    "learning.validate_run", ValidateRunInput, RunPlan, LIGHT_TIMEOUT, LIGHT_RETRY)
SET_RUN_STATUS = ActivityContract(
    "learning.set_run_status", RunStatusInput, type(None), LIGHT_TIMEOUT, LIGHT_RETRY)
CONTROL_RUN = ActivityContract(
    "learning.control_run", ControlInput, ControlDecision, LIGHT_TIMEOUT, LIGHT_RETRY)
PROPOSE_CHECKPOINT = ActivityContract(
    "learning.propose_checkpoint", ProposeInput, ProposeResult, LIGHT_TIMEOUT, LIGHT_RETRY)
RECORD_MITIGATION = ActivityContract(
    "learning.record_mitigation", MitigationInput, MitigationRecorded, LIGHT_TIMEOUT,
    LIGHT_RETRY)
# Torch activities on the ``learning-gpu`` queue. Loading a base model may download
# nothing but can still take a while on a cold disk; an update can take hours, so the
# run's own heartbeat timeout (``TrainingRunInput.update_heartbeat_timeout_s``) is what
# notices a dead worker.
REGISTER_BASE_CHECKPOINT = ActivityContract(
    "learning.register_base_checkpoint", RegisterBaseInput, BaseCheckpoint,
    timedelta(hours=1), LIGHT_RETRY)
UPDATE_POLICY = ActivityContract(
    "learning.update_policy", UpdateInput, UpdateResult, timedelta(hours=12),
    RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                maximum_interval=timedelta(seconds=30), maximum_attempts=20))
# A person's model import (``ModelImportWorkflow``): loading and converting a GGUF of a
# 135M model takes about half a minute, far longer on a busy machine; the activity
# heartbeats while it works. A bad source fails at once (InvalidRequest, not retried).
IMPORT_MODEL = ActivityContract(
    "learning.import_model", ModelImportInput, ModelImportResult, timedelta(hours=1),
    RetryPolicy(maximum_attempts=3, maximum_interval=timedelta(seconds=30)),
    heartbeat=timedelta(minutes=2))
