"""Activity names and their inputs/outputs: plain dataclasses, one in and one out.

Torch-free and database-free so ``learning_loop.workflows`` can import it inside the
workflow sandbox. Fields may be added later (with defaults) without breaking histories.
No ``from __future__ import annotations``: the payload converter resolves field types
with ``get_type_hints``, which cannot see this module's globals from inside the sandbox.
"""

from dataclasses import dataclass, field
from typing import Any

from triloop.run_config import RunConfig
from triloop.workflow_api import StabilityAlarm

# Light activities on the ``learning`` queue.
VALIDATE_RUN = "learning.validate_run"
SET_RUN_STATUS = "learning.set_run_status"
CONTROL_RUN = "learning.control_run"
PROPOSE_CHECKPOINT = "learning.propose_checkpoint"
RECORD_MITIGATION = "learning.record_mitigation"
# Torch activities on the ``learning-gpu`` queue.
REGISTER_BASE_CHECKPOINT = "learning.register_base_checkpoint"
UPDATE_POLICY = "learning.update_policy"

# Error types raised as non-retryable ApplicationErrors (the workflow reports them as is).
RUN_NOT_FOUND = "RunNotFound"
TASK_NOT_ADMITTED = "TaskNotAdmitted"
BASE_MODEL_NOT_FOUND = "BaseModelNotFound"
INVALID_TRAINING_DATA = "InvalidTrainingData"
CHECKPOINT_BROKEN = "CheckpointBroken"


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
    # Metric keys the workflow knows of the iteration (resample rounds, tasks filtered by
    # pass rate, the curriculum's max_turns), stored with the iteration's series.
    series: dict[str, float] = field(default_factory=dict)
    # Mitigations so far (learning_loop.mitigation): added to objective.entropy_coef, and
    # multiplying optimizer.learning_rate (unitless).
    entropy_coef_bonus: float = 0.0
    learning_rate_scale: float = 1.0


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
