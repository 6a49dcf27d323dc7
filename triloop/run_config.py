"""Training-run configuration: the RUN.yaml an ML engineer submits, validated with clear errors.

Torch-free on purpose (pydantic + PyYAML only) so the API, the CLI and the learning workflow
can validate a run without importing torch. Every section forbids unknown keys, so a typo is
an error with its dotted path rather than a silently ignored setting.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from triloop import safe_yaml


class RunConfigError(Exception):
    """A run configuration that cannot be used; `problems` lists every one with its path."""

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p.path}: {p.message}" for p in self.problems)
        super().__init__(f"invalid run configuration ({len(self.problems)} problem(s)):\n{lines}")


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a run configuration: dotted path (`objective.clip_eps_low`) and message."""

    path: str
    message: str


MAX_TASK_IDS = 10_000
MAX_TASK_SETS = 50
TaskId = Annotated[str, Field(min_length=1, max_length=200)]


class _Section(BaseModel):
    # Finite numbers only: a run config is stored as JSON, which has no NaN or infinity.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSection(_Section):
    """Which policy the run starts from."""

    base: str = Field(
        min_length=1,
        description="Path of a Hugging Face model directory (it holds a slash), or a registered "
        "checkpoint: its sha256 id, a unique prefix of it (6+ hex digits), or the name an "
        "import gave it (`triloop model import`). The web service resolves a name or prefix "
        "to the id when the run is submitted, and the run stores the id.")


class TaskSetSelection(_Section):
    """The tasks of one split of an admitted task set."""

    task_set: str = Field(
        min_length=1, max_length=200,
        description="The task set: NAME@V, NAME (its newest version), or its id or a unique "
        "prefix of it (6+ hex digits). The web service resolves it when the run is "
        "submitted, and the run stores the set's id.")
    split: Literal["train", "eval", "traffic"] = Field(
        default="train",
        description="Which of the set's splits: a training run trains on \"train\" only; the "
        "eval and traffic splits are held out, and naming one is refused.")


TagName = Annotated[str, Field(min_length=1, max_length=100)]


class CurriculumStage(_Section):
    """From an iteration on, only the run's training tasks whose tags match are sampled."""

    from_iteration: int = Field(ge=1, description="First iteration (1-based) of the stage (count).")
    tags: dict[TagName, list[TagName]] = Field(
        min_length=1, max_length=16,
        description="Tag key -> the values it may take (a task's ``task.tags``): a task is "
        "sampled when, for every key, its value is one of these; for example "
        "{difficulty: [easy, medium]}.")

    @model_validator(mode="after")
    def _values_given(self) -> CurriculumStage:
        empty = sorted(key for key, values in self.tags.items() if not values)
        if empty:
            raise ValueError(f"tag key(s) {empty} list no value: the stage would select no task")
        return self


class RolloutSection(_Section):
    """How the execution loop samples trajectories for each iteration."""

    task_ids: list[TaskId] = Field(
        default_factory=list, max_length=MAX_TASK_IDS,
        description="Admitted task ids to sample from; each iteration draws groups from these "
        "tasks. Bounded so that one request cannot ask the database about millions of "
        "ids. With task_sets, the web service adds their tasks to these when the run is "
        "submitted (the stored run lists them all).")
    task_sets: list[TaskSetSelection] = Field(
        default_factory=list, max_length=MAX_TASK_SETS, validate_default=True,
        description="Admitted task sets and splits to train on, e.g. [{task_set: "
        "arith@1, split: train}], beside or instead of task_ids; each set's split "
        "becomes its task ids, in the set's order, at submission.")
    group_size: int = Field(
        default=8, ge=2, le=1024,
        description="Samples per group (same task and seed), G in GRPO; a group needs 2+ for a "
        "baseline.")
    groups_per_iteration: int = Field(
        default=4, ge=1,
        description="Groups sampled per iteration (count); samples per iteration = groups * "
        "group_size.")
    max_turns: int | None = Field(
        default=None, ge=1,
        description="Turns (model actions) per episode at most (count); longer episodes are "
        "truncated. None: the environment contract's limits.max_turns. A run may lower "
        "an environment's limit, never raise it; sampling.horizon_schedule changes it "
        "over the run.")
    max_new_tokens: int | None = Field(
        default=None, ge=1,
        description="Tokens the policy may generate per turn at most (tokens): the inference "
        "backend's generation limit. None: the environment contract's "
        "limits.max_tokens_per_turn. Like max_turns, a run may lower an environment's "
        "limit, never raise it.")
    temperature: float = Field(
        default=1.0, gt=0.0, le=2.0,
        description="Sampling temperature (unitless, > 0); 1.0 keeps behaviour logprobs of the "
        "true policy.")
    deadline_s: float = Field(
        default=600.0, gt=0.0,
        description="Wall-clock budget for one rollout batch (seconds); unfinished episodes count "
        "as truncated.")
    heartbeat_timeout_s: float = Field(
        default=60.0, gt=0.0, le=3600.0,
        description="How long an episode may go without progress before its group counts as "
        "stuck (seconds). Progress is a step, a decoded token (in-process torch backend), or "
        "loading a checkpoint, so a slow turn is not stuck as long as its tokens come; a "
        "remote backend's turn must end within it. A stuck group fails with \"heartbeat "
        "timeout while <stage>\", and its episodes are lost to the batch.")
    curriculum: list[CurriculumStage] = Field(
        default_factory=list, max_length=64,
        description="Curriculum by tag: stages in order of from_iteration; from a stage's "
        "iteration on, only the run's tasks whose tags match the stage's are sampled "
        "(before the first stage, all of them), as sampling.horizon_schedule does for "
        "max_turns. Every tag key must be one the run's tasks carry and every stage must "
        "select at least one of them (checked when the run is submitted). Empty: none.")

    @field_validator("task_sets")
    @classmethod
    def _some_tasks(cls, task_sets: list[TaskSetSelection],
                    info: ValidationInfo) -> list[TaskSetSelection]:
        # Only when task_ids itself was valid: otherwise its own problem says enough.
        if "task_ids" in info.data and not info.data["task_ids"] and not task_sets:
            raise ValueError("no tasks to train on: give rollout.task_ids, rollout.task_sets"
                             " or both")
        return task_sets


class AdvantageConfig(_Section):
    """How trajectory returns become advantages (see learning_loop.advantages)."""

    scale_by_group_std: bool = Field(
        default=True,
        description="Divide by the group's reward std as in GRPO; False keeps r - mean only (Dr. "
        "GRPO).")
    task_normalization: bool = Field(
        default=False,
        description="Scale by the std of the group-centred returns of all informative groups of "
        "the same task instead of each group's own std (AgentRL), so tasks with "
        "different reward scales weigh the same in a multi-task batch. (Dividing again "
        "after the group std would do nothing: every group already has std 1.)")
    eps: float = Field(
        default=1e-6, gt=0.0,
        description="Added to a std before dividing (reward units); keeps near-constant groups "
        "finite.")
    zero_variance_tolerance: float = Field(
        default=1e-8, ge=0.0,
        description="A group whose reward std is at most this (reward units) has zero variance: "
        "advantage 0.")
    # --- issue 18: turn-level credit and environment-level normalisation ---
    environment_normalization: bool = Field(
        default=False,
        description="Scale by the std of the group-centred returns of every informative group of "
        "the same environment (ERPO, AutoForge); takes precedence over "
        "task_normalization.")
    credit: Literal["outcome", "discounted", "turn_grpo"] = Field(
        default="outcome",
        description="What each turn is credited with: \"outcome\" = the episode's return on every "
        "turn (GRPO; use with outcome-only rewards and short horizons); \"discounted\" "
        "= the turn's discounted return-to-go against the group's mean return (use "
        "with per-step rewards on long horizons); \"turn_grpo\" = returns-to-go "
        "normalised against all turns of the group (turn-level GRPO; dense process "
        "rewards whose scale varies over turns).")
    gamma: float = Field(
        default=1.0, gt=0.0, le=1.0,
        description="Discount per turn for \"discounted\" and \"turn_grpo\" (unitless, 0 < gamma "
        "<= 1).")
    # --- issue 27: the reward placebo control ---
    zero_task_reward: bool = Field(
        default=False,
        description="Placebo run (the Reward Placebo Trial): train with each trajectory's task"
        " term removed from its return, the outcome term \"success\" an environment names in"
        " its outcome's reward_terms, or, where it does not split its outcome reward, the"
        " whole outcome reward of a successful episode; shaping and process rewards stay."
        " Such a run never proposes a candidate: its last checkpoint is the placebo a"
        " threshold's placebo check compares candidates of the same config with. Made by"
        " `triloop train placebo RUN` rather than by hand.")


class ObjectiveConfig(_Section):
    """The GRPO clipped objective (see learning_loop.objective)."""

    clip_eps_low: float = Field(
        default=0.2, gt=0.0, lt=1.0,
        description="Lower clip range (unitless): the ratio is clipped below at 1 - clip_eps_low.")
    clip_eps_high: float = Field(
        default=0.28, gt=0.0, le=10.0,
        description="Upper clip range (unitless): clipped above at 1 + clip_eps_high (DAPO "
        "\"clip-higher\").")
    aggregation: Literal["token", "sequence"] = Field(
        default="token",
        description="\"token\": mean over all action tokens of the batch (DAPO); \"sequence\": "
        "mean per sample, then mean over samples (original GRPO).")
    kl_coef: float = Field(
        default=0.0, ge=0.0,
        description="Weight of the k3 KL penalty to the frozen reference (unitless); 0 disables "
        "the reference.")
    entropy_coef: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="issue 18: weight of the entropy bonus (unitless): the loss subtracts "
        "entropy_coef times the policy's entropy per action token (nats). 0 = none; "
        "mitigation.on_alarm may raise it.")


class OptimizerConfig(_Section):
    """AdamW with linear warm-up to a constant learning rate."""

    learning_rate: float = Field(
        default=1e-5, gt=0.0, le=1.0,
        description="Peak learning rate (per optimizer step).")
    weight_decay: float = Field(
        default=0.0, ge=0.0,
        description="Decoupled weight decay (unitless, per step, scaled by the learning rate).")
    beta1: float = Field(
        default=0.9, ge=0.0, lt=1.0,
        description="AdamW first moment decay rate (unitless).")
    beta2: float = Field(default=0.999, ge=0.0, lt=1.0,
                         description="AdamW second moment decay rate (unitless).")
    adam_eps: float = Field(
        default=1e-8, gt=0.0,
        description="AdamW denominator epsilon (unitless).")
    warmup_steps: int = Field(
        default=0, ge=0,
        description="Linear warm-up length (optimizer steps); the rate is constant afterwards.")


ModuleName = Annotated[str, Field(min_length=1, max_length=100,
                                    pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class LoraConfig(_Section):
    """A LoRA update (Hu et al., 2021) with peft: train low-rank adapters, keep the base frozen.

    Each targeted linear layer ``W x`` becomes ``W x + (alpha / rank) B A x`` with ``A``
    (rank x in) and ``B`` (out x rank) trained and ``W`` frozen; ``B`` starts at zero, so
    the first policy is the base. Checkpoints are then adapters on the run's base.
    """

    rank: int = Field(ge=1, le=1024, description=(
        "Rank r of each adapter's A and B matrices (count): trainable parameters grow with it."))
    alpha: int = Field(ge=1, le=65_536, description=(
        "LoRA alpha (unitless integer, as peft and vLLM take it): the adapter's output is"
        " scaled by alpha / rank."))
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description=(
        "Dropout probability on each adapter's input during the update (0 <= p < 1). The"
        " update otherwise runs without dropout so that its ratio compares the function"
        " the rollout sampled; above 0 the ratio is taken against a dropped-out adapter"
        " (as TRL with peft does). Never applied while sampling."))
    target_modules: list[ModuleName] = Field(min_length=1, max_length=64, description=(
        "Names of the linear layers that get an adapter, matched against the last part of"
        " each module's name (Llama: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,"
        " down_proj). A name the model lacks is refused before training, listing those"
        " it has."))

    @model_validator(mode="after")
    def _distinct_targets(self) -> LoraConfig:
        repeated = sorted({m for m in self.target_modules if self.target_modules.count(m) > 1})
        if repeated:
            raise ValueError(f"target_modules names {repeated} more than once")
        return self


class UpdateConfig(_Section):
    """Batching of one policy update and the off-policy guard (see learning_loop.update)."""

    micro_batch_size: int = Field(
        default=8, ge=1,
        description="Sequences per forward/backward pass (count; one per trajectory, or per "
        "segment where a prompt did not extend the one before); gradients accumulate across "
        "micro-batches.")
    optimizer_steps_per_batch: int = Field(
        default=1, ge=1,
        description="Optimizer steps per batch of rollouts (count); the batch is split into this "
        "many mini-batches. 1 = one step per iteration, as in most GRPO set-ups.")
    max_grad_norm: float = Field(
        default=1.0, gt=0.0,
        description="Global gradient L2 norm is clipped to this (unitless); the pre-clip norm is "
        "reported.")
    max_staleness: int = Field(
        default=1, ge=0,
        description="Samples generated more than this many policy versions ago are stale (policy "
        "versions).")
    stale_samples: Literal["drop", "importance_correct"] = Field(
        default="drop",
        description="What to do with stale samples: \"drop\" them, or \"importance_correct\" them "
        "(clip against the current policy and weight by a truncated current/behaviour "
        "ratio).")
    importance_weight_cap: float = Field(
        default=2.0, ge=1.0,
        description="Upper bound of the per-token importance weight for corrected samples "
        "(unitless, >= 1).")
    # --- issue 14: a learner beyond one device ---
    world_size: int = Field(default=1, ge=1, le=64, description=(
        "Ranks (processes) that run the policy update (count). 1: inside the learning-gpu"
        " worker's process. More: that many torch.distributed ranks on the worker's machine,"
        " launched with torchrun over loopback; each trains on its shard of every mini-batch,"
        " gradients are summed across ranks (the same update as one rank) and rank 0 saves"
        " the checkpoint once. With nccl, one GPU per rank."))
    distributed_backend: Literal["auto", "gloo", "nccl"] = Field(default="auto", description=(
        "torch.distributed backend of a multi-rank update: nccl (one CUDA device per rank),"
        " gloo (CPU ranks), or auto (nccl when the worker has CUDA, else gloo)."))
    bf16_autocast: bool = Field(default=False, description=(
        "Run the model's forward under bfloat16 autocast (weights, optimizer and loss stay"
        " fp32). Refused on a GPU without bf16 (before compute capability 8.0); on CPU it"
        " is emulated where the CPU lacks bf16 instructions (correct, slower)."))
    gradient_checkpointing: bool = Field(default=False, description=(
        "Recompute each decoder layer's activations in the backward pass instead of"
        " storing them: less activation memory for about one more forward's compute."))
    rank_timeout_s: float = Field(default=3600.0, gt=0.0, le=86_400.0, description=(
        "Wall-clock limit of a multi-rank update (seconds); the ranks are stopped after it"
        " and the activity fails naming the ranks that had not finished."))
    # --- issue 25: LoRA beside full fine-tuning ---
    lora: LoraConfig | None = Field(default=None, description=(
        "Train LoRA adapters on the frozen base instead of every weight (see LoraConfig);"
        " absent: full fine-tuning. Each checkpoint is then an adapter whose id is the"
        " digest of its adapter weights and its base's id."))


class StabilityConfig(_Section):
    """Thresholds and windows of the stability detectors (see learning_loop.stability)."""

    echo_window: int = Field(
        default=6, ge=3,
        description="Iterations looked at by the echo-trap detector (count); needs this much "
        "history.")
    reward_plateau_tolerance: float = Field(
        default=0.05, ge=0.0,
        description="Reward plateau: fitted change of mean reward across the window at most this "
        "(reward units).")
    variance_drop: float = Field(
        default=0.3, gt=0.0,
        description="Within-group reward variance must fall by at least this share of its window "
        "mean.")
    entropy_drop: float = Field(
        default=0.1, gt=0.0,
        description="Token entropy must fall by at least this share of its window mean.")
    grad_norm_rise: float = Field(
        default=0.3, gt=0.0,
        description="Gradient norm must rise by at least this share of its window mean.")
    retrieval_margin: float = Field(
        default=0.1, ge=0.0, le=1.0,
        description="Template collapse: retrieval accuracy at most chance + this margin (share, "
        "0..1) ...")
    collapse_min_entropy: float = Field(
        default=0.5, ge=0.0,
        description="... while token entropy stays at or above this (nats per token).")
    collapse_requires_prior_discrimination: bool = Field(
        default=False,
        description="Alarm only if an earlier iteration discriminated clearly (accuracy above "
        "chance + margin): for runs from a randomly initialised model, which never "
        "depends on its input.")
    discrimination_alpha: float = Field(
        default=0.05, gt=0.0, le=1.0,
        description="\"Clearly\": a one-sided binomial test of the hits against chance must reach "
        "this significance (probability, 0..1), so a lucky reading over few prompts "
        "does not count.")
    min_discrimination_prompts: int = Field(
        default=4, ge=2,
        description="Fewer distinct prompts than this make retrieval accuracy too noisy to judge "
        "(count).")
    discrimination_prompts: int = Field(
        default=8, ge=2,
        description="Distinct prompts scored against each other per iteration (count; cost grows "
        "as n^2).")
    pause_on_alarm: bool = Field(
        default=True,
        description="Pause the run on an alarm and wait for an ML engineer to resume or cancel it.")


class ScheduleSection(_Section):
    """How long the run lasts and how often it proposes.

    Every iteration writes its checkpoint: the next rollouts are served from it and a
    retried update resumes from it, so there is no checkpoint interval to set.
    """

    iterations: int = Field(default=10, ge=1, description="Iterations of rollout + update (count).")
    propose_every: int = Field(
        default=5, ge=1,
        description="Propose the latest checkpoint to governance every this many iterations "
        "(count).")
    seed: int = Field(
        default=0, ge=0,
        description="Seed for torch, python and sampling (integer); the same seed repeats the run "
        "on CPU.")


# --- issue 18: the seeds' learning practices (dynamic data, asynchrony, mitigations) ---


class HorizonStage(_Section):
    """From an iteration on, episodes get at most this many turns."""

    from_iteration: int = Field(ge=1, description="First iteration (1-based) of the stage (count).")
    max_turns: int = Field(
        ge=1,
        description="Turns per episode at most from then on (count); still capped by the "
        "contract's limit.")


class SamplingConfig(_Section):
    """Which tasks and groups an iteration trains on (see learning_loop.dynamic_data)."""

    dynamic_sampling: bool = Field(
        default=False,
        description="Dynamic sampling (DAPO): groups whose rewards do not vary are dropped before "
        "the update (so their zero-advantage tokens leave the loss denominator) and "
        "more groups are sampled until the iteration has min_informative_groups, "
        "within the budget.")
    min_informative_groups: int | None = Field(
        default=None, ge=1,
        description="Groups with reward variance an iteration aims for (count); None: "
        "groups_per_iteration.")
    max_resample_rounds: int = Field(
        default=2, ge=0, le=16,
        description="Extra rollout batches per iteration at most (count); the budget of the "
        "resampling.")
    pass_rate_filter: bool = Field(
        default=False,
        description="Pass-rate filtering: a task whose success rate over its last pass_rate_window "
        "groups is below min_pass_rate or above max_pass_rate is not sampled (always "
        "solved or never solved). If every task is filtered, all are sampled.")
    pass_rate_window: int = Field(
        default=3, ge=1, le=100,
        description="Groups of a task looked at (count); a task with fewer is always sampled.")
    min_pass_rate: float = Field(
        default=0.05, ge=0.0, le=1.0,
        description="Lower bound of the success rate a sampled task keeps (share, 0..1).")
    max_pass_rate: float = Field(
        default=0.95, ge=0.0, le=1.0,
        description="Upper bound of the success rate a sampled task keeps (share, 0..1).")
    horizon_schedule: list[HorizonStage] = Field(
        default_factory=list, max_length=64,
        description="Horizon curriculum (ScalingInter-RL, AgentGym-RL): max_turns per stage, in "
        "order of from_iteration; before the first stage rollout.max_turns applies. "
        "Empty: no schedule.")


class AsynchronyConfig(_Section):
    """How far rollouts may run ahead of the update, and what a cut episode teaches."""

    staleness_window: int = Field(
        default=1, ge=1, le=8,
        description="Rollouts in flight ahead of the update (policy versions); 1 = today's "
        "one-step overlap. Samples older than update.max_staleness are dropped or "
        "importance-corrected.")
    truncated_episodes: Literal["exclude_clock", "exclude_all", "train"] = Field(
        default="exclude_clock",
        description="Truncated episodes: \"exclude_clock\" leaves out episodes the clock cut "
        "(batch deadline, episode deadline, wall time), whose partial reward would "
        "teach \"finish fast\", and trains on episodes the horizon ended (max_turns, "
        "tokens: the environment's own rule); \"exclude_all\" leaves out every "
        "truncated episode; \"train\" trains on all (before issue 18). Left-out "
        "episodes are neither in the group baseline nor in the loss.")
    partial_rollouts: bool = Field(
        default=False,
        description="Partial rollouts: an episode the batch deadline cut is continued in the "
        "run's next rollout batch under the newer policy (the environment is reset with the "
        "same seed and the stored actions replayed), its turns keeping the version that "
        "sampled them; its group trains once it finished. false: cut episodes only follow "
        "truncated_episodes.")
    max_continuations: int = Field(
        default=2, ge=1, le=16,
        description="Continuations of one episode at most (count); one still cut after this "
        "many is given up and left out per truncated_episodes, and its group trains without "
        "it.")


class MitigationConfig(_Section):
    """What the run does itself when a stability alarm fires (see learning_loop.mitigation)."""

    on_alarm: Literal["none", "raise_entropy", "lower_learning_rate", "rollback"] = Field(
        default="none",
        description="\"none\": only alarm (and pause per stability.pause_on_alarm); "
        "\"raise_entropy\": add entropy_step to the entropy bonus; "
        "\"lower_learning_rate\": multiply the learning rate by learning_rate_factor; "
        "\"rollback\": continue from the checkpoint before the alarm.")
    entropy_step: float = Field(
        default=0.01, gt=0.0, le=1.0,
        description="Added to objective.entropy_coef per alarm (unitless).")
    learning_rate_factor: float = Field(
        default=0.5, gt=0.0, lt=1.0,
        description="Multiplies the learning rate per alarm (unitless, 0 < f < 1).")
    max_actions: int = Field(
        default=3, ge=1, le=100,
        description="Mitigations at most per run (count); later alarms only alarm.")


class CheckpointsConfig(_Section):
    """Retention: how many iterations keep their weights (see learning_loop.retention).

    After each iteration the learner deletes the weights and trainer state of the run's
    older checkpoints; their lineage rows and digests stay, marked pruned. Whatever the
    count, the database keeps what serves or may serve production (aliases, rollback
    targets, routing, open promotions), every proposed candidate and every base.
    """

    keep_last: int | None = Field(
        default=None, ge=1, le=100_000,
        description="Iterations whose checkpoints keep their files (count, >= 1): the newest"
        " ones (a resume needs the newest, a mitigation rollback its parent). None: the"
        " stack's TRILOOP_CHECKPOINT_KEEP_LAST (default 3). The stack's"
        " TRILOOP_CHECKPOINT_RETENTION=false keeps every checkpoint.")


class RunConfig(_Section):
    """A whole training run, as submitted in RUN.yaml."""

    name: str = Field(
        min_length=1, max_length=200,
        description="Human-readable run name (shown in the console; not an identifier).")
    # Sections; each class above documents its fields and units. Only model and rollout
    # are required, the others have defaults.
    model: ModelSection
    rollout: RolloutSection
    advantage: AdvantageConfig = AdvantageConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    update: UpdateConfig = UpdateConfig()
    stability: StabilityConfig = StabilityConfig()
    schedule: ScheduleSection = ScheduleSection()
    # issue 18 sections
    sampling: SamplingConfig = SamplingConfig()
    asynchrony: AsynchronyConfig = AsynchronyConfig()
    mitigation: MitigationConfig = MitigationConfig()
    # issue 25: checkpoint retention
    checkpoints: CheckpointsConfig = CheckpointsConfig()

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        # Raised as RunConfigError (not ValueError) so pydantic lets it through with its paths.
        problems = cross_field_problems(self)
        if problems:
            raise RunConfigError(problems)
        return self


def cross_field_problems(config: RunConfig) -> list[ConfigProblem]:
    """Problems that involve more than one field (each field alone being valid)."""
    problems: list[ConfigProblem] = []
    schedule, rollout, update, stability = (
        config.schedule, config.rollout, config.update, config.stability
    )
    if schedule.propose_every > schedule.iterations:
        problems.append(ConfigProblem(
            "schedule.propose_every",
            f"{schedule.propose_every} is more than schedule.iterations ({schedule.iterations}):"
            " the run would never propose a candidate",
        ))
    samples = rollout.groups_per_iteration * rollout.group_size
    if update.optimizer_steps_per_batch > samples:
        problems.append(ConfigProblem(
            "update.optimizer_steps_per_batch",
            f"{update.optimizer_steps_per_batch} is more than the {samples} trajectories per"
            " iteration (rollout.groups_per_iteration * rollout.group_size)",
        ))
    if config.asynchrony.partial_rollouts and config.asynchrony.truncated_episodes == "train":
        problems.append(ConfigProblem(
            "asynchrony.partial_rollouts",
            "needs asynchrony.truncated_episodes to leave clock-cut episodes out (not"
            " \"train\"): a cut episode must not train on its partial outcome while its"
            " continuation is still running",
        ))
    per_step = samples // update.optimizer_steps_per_batch
    if update.world_size > 1 and update.world_size > per_step:
        problems.append(ConfigProblem(
            "update.world_size",
            f"{update.world_size} ranks for mini-batches of {per_step} trajectories"
            " (rollout.groups_per_iteration * rollout.group_size / optimizer_steps_per_batch):"
            " some ranks would have nothing to train on",
        ))
    if update.lora is not None and update.world_size > 1:
        problems.append(ConfigProblem(
            "update.lora",
            f"a LoRA update runs on one rank; update.world_size is {update.world_size}: set it"
            " to 1, or remove update.lora for a multi-rank full fine-tuning",
        ))
    if stability.min_discrimination_prompts > stability.discrimination_prompts:
        problems.append(ConfigProblem(
            "stability.min_discrimination_prompts",
            f"{stability.min_discrimination_prompts} is more than"
            f" stability.discrimination_prompts ({stability.discrimination_prompts})",
        ))
    problems.extend(_practice_problems(config))
    return problems


def _practice_problems(config: RunConfig) -> list[ConfigProblem]:
    """Cross-field problems of the issue-18 sections."""
    problems: list[ConfigProblem] = []
    sampling = config.sampling
    if sampling.min_pass_rate > sampling.max_pass_rate:
        problems.append(ConfigProblem(
            "sampling.min_pass_rate",
            f"{sampling.min_pass_rate} is more than sampling.max_pass_rate"
            f" ({sampling.max_pass_rate}): every task would be filtered out",
        ))
    starts = [stage.from_iteration for stage in sampling.horizon_schedule]
    if starts != sorted(set(starts)):
        problems.append(ConfigProblem(
            "sampling.horizon_schedule",
            f"stages must start at increasing iterations, got {starts}",
        ))
    stages = [stage.from_iteration for stage in config.rollout.curriculum]
    if stages != sorted(set(stages)):
        problems.append(ConfigProblem(
            "rollout.curriculum",
            f"stages must start at increasing iterations, got {stages}",
        ))
    window = config.asynchrony.staleness_window
    # window 1 is the overlap every run always had, whatever max_staleness says.
    if 1 < window and window > config.update.max_staleness \
            and config.update.stale_samples == "drop":
        problems.append(ConfigProblem(
            "asynchrony.staleness_window",
            f"{window} is more than update.max_staleness ({config.update.max_staleness}) while"
            " stale samples are dropped: the oldest rollouts would be thrown away; raise"
            " max_staleness or set update.stale_samples to importance_correct",
        ))
    return problems


def load_run_config(text: str) -> RunConfig:
    """Parse and validate RUN.yaml text; raises RunConfigError listing every problem.

    YAML aliases are refused (``triloop.safe_yaml``): a run config never needs one, and
    one can expand a few hundred bytes into billions of values.
    """
    try:
        data = safe_yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc)
        if isinstance(exc, safe_yaml.YamlAliasRefused | safe_yaml.YamlTooDeep):
            raise RunConfigError([ConfigProblem("(yaml)", f"refused{where}: {what}")]) from exc
        raise RunConfigError([ConfigProblem("(yaml)", f"not valid YAML{where}: {what}")]) from exc
    return run_config_from_data(data)


def run_config_from_data(data: Any) -> RunConfig:
    """Validate an already parsed run config (a JSON object); raises RunConfigError."""
    if not isinstance(data, dict):
        got = "an empty document" if data is None else type(data).__name__
        problem = ConfigProblem("(root)", f"expected a mapping of sections, got {got}")
        raise RunConfigError([problem])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise RunConfigError(_problems_from(exc)) from exc


def _problems_from(exc: ValidationError) -> list[ConfigProblem]:
    problems = []
    for error in exc.errors(include_url=False):
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown setting (check its spelling and section)"
        elif error["type"] != "missing" and "input" in error:
            message = f"{message} (got {_short(error['input'])})"
        problems.append(ConfigProblem(_dotted(error["loc"]), message))
    return problems


def _dotted(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(root)"


_ECHO = reprlib.Repr()
_ECHO.maxstring, _ECHO.maxother, _ECHO.maxlist, _ECHO.maxdict, _ECHO.maxlevel = 60, 60, 4, 4, 2


def _short(value: Any) -> str:
    # reprlib never builds the whole repr: a 10 MB value costs no more than a short one.
    return _ECHO.repr(value)
