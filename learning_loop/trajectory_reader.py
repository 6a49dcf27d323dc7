"""Load rollout batches from the database as the learner's step records.

The execution loop stores a ``trajectory`` row per episode, its tokens once as a
``trajectory_sequence`` (ids exactly as generated, the action mask, the behaviour
logprobs) and a ``step`` row per turn that points into the sequence by offsets
(``triloop.token_sequence``). The reader slices each turn's prompt and action back out;
the update packs them into one forward pass per trajectory again. Step rows carry the
per-turn (process) reward only; the outcome reward the verifier gave at the end is in
the trajectory's ``total_reward``. So that a trajectory's return is its ``total_reward``
(what the execution loop reported), the difference is added as a reward-only record (no
action tokens) after the last step.

A placebo run (``advantage.zero_task_reward``, the Reward Placebo Trial) trains on the same
episodes with each one's task term taken out of that outcome record (``task_reward``): the
outcome's named ``success`` term, or, where the environment does not split its outcome
reward, the whole outcome reward of a successful episode. Its returns (and the monitors
over them) are then the returns it trains on; success is still reported as the verdict.

Only ``training`` episodes of the run that played at least one turn and finished
(``completed`` or ``truncated``) are read. ``failed`` episodes have no trustworthy reward,
and a truncated episode without steps (the batch deadline came before it started) says
nothing about the policy; both are left out, and counted. Truncated episodes with steps
follow ``asynchrony.truncated_episodes`` (see learning_loop.asynchrony).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Engine, and_, or_, text
from sqlmodel import Session, col, select

from learning_loop.advantages import TrajectoryReturn
from learning_loop.asynchrony import TruncationRule, learns_from
from learning_loop.batch import InvalidSampleError, StepRecord
from triloop.models import Trajectory
from triloop.reward_terms import TASK_TERM
from triloop.statuses import EpisodeStatus, Purpose
from triloop.token_sequence import (
    SequenceLayoutError,
    TokenSequence,
    TurnOffsets,
    marks_only_the_action,
    step_action_mask,
    unpack_turns,
)

_TRAINING_STEPS = text(
    "SELECT trajectory_id, index, prompt_start, observation_start, action_start, action_end, "
    "reward, policy_version FROM learning_step WHERE trajectory_id = ANY(:ids) "
    "ORDER BY trajectory_id, index")
_TRAINING_SEQUENCES = text(
    "SELECT trajectory_id, token_ids, action_mask, behaviour_logprobs, segment_starts "
    "FROM learning_trajectory_sequence WHERE trajectory_id = ANY(:ids)")

USABLE_STATUSES = (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED)
# A placebo run removes the task term (``triloop.reward_terms.TASK_TERM``) from every return.


@dataclass(frozen=True)
class StoredStep:
    """The columns of a ``step`` row the learner needs."""

    index: int
    prompt_token_ids: Sequence[int]
    action_token_ids: Sequence[int]
    action_mask: Sequence[int]
    behaviour_logprobs: Sequence[float]
    reward: float
    policy_version: int | None = None  # None: the trajectory's (see partial rollouts)


@dataclass(frozen=True)
class StoredTrajectory:
    """The columns of a ``trajectory`` row the learner needs, with its steps in order."""

    id: str
    group_id: str
    task_id: str
    policy_version: int
    total_reward: float
    steps: Sequence[StoredStep]
    environment: str = ""  # the environment's name
    status: str = EpisodeStatus.COMPLETED  # completed | truncated
    failure_reason: str | None = None  # the limit that truncated it
    success: bool | None = None  # the task's own verdict (None: not known to the reader)
    # The outcome reward's terms as the environment named them (``Outcome.details
    # ["reward_terms"]``); None: it did not split its outcome reward.
    outcome_terms: Mapping[str, float] | None = None


@dataclass
class RolloutData:
    """A batch ready for ``build_training_samples`` plus what the monitors need."""

    steps: list[StepRecord] = field(default_factory=list)
    returns: list[TrajectoryReturn] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # action tokens per trajectory
    policy_versions: list[int] = field(default_factory=list)  # one per trajectory
    skipped: int = 0  # failed or never-started episodes left out
    truncated_excluded: int = 0  # truncated episodes left out by asynchrony.truncated_episodes


def check_action_mask(step: StoredStep, trajectory_id: str) -> None:
    """The mask must be 0 over the prompt and 1 over the action (empty: not recorded)."""
    if not step.action_mask:
        return
    prompt, action = len(step.prompt_token_ids), len(step.action_token_ids)
    if not marks_only_the_action(step.action_mask, prompt, action):
        raise InvalidSampleError(
            f"step {step.index} of trajectory {trajectory_id!r}: its action mask does not mark"
            f" exactly the {action} action tokens after the {prompt} prompt tokens; the learner"
            " trains on model-generated tokens only and will not guess which ones they are"
        )


class TaskNotInRun(InvalidSampleError):
    """A trajectory of a task the run was not admitted to train on."""


def check_admitted(trajectories: Sequence[StoredTrajectory], allowed: Mapping[str, str]) -> None:
    """Every trajectory is of one of the run's admitted tasks (``allowed``; empty: no check)."""
    if not allowed:
        return
    stray = sorted({t.task_id for t in trajectories if t.task_id not in allowed})
    if stray:
        raise TaskNotInRun(
            f"trajectories of task(s) {stray[:5]} are not among the run's admitted training"
            " tasks; the learner trains only on what the run plan admitted"
        )


def outcome_reward_terms(outcome: Mapping[str, Any]) -> dict[str, float] | None:
    """The outcome reward's named terms in a stored ``trajectory.outcome`` (pure); None when
    the environment named none, or named them in a shape that is not ``{term: number}``."""
    details = outcome.get("verifier")
    terms = details.get("reward_terms") if isinstance(details, Mapping) else None
    if not isinstance(terms, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            and math.isfinite(v) for k, v in terms.items()):
        return None
    return {k: float(v) for k, v in terms.items()}


def task_reward(trajectory: StoredTrajectory, step_rewards: float) -> float:
    """The trajectory's task term, which a placebo run removes from its return (pure).

    The outcome's named ``success`` term when the environment splits its outcome reward;
    otherwise the whole outcome reward (``total_reward`` minus the step rewards) of a
    successful episode, and nothing of a failed one (its outcome reward is no task reward).
    """
    if trajectory.outcome_terms is not None:
        return trajectory.outcome_terms.get(TASK_TERM, 0.0)
    return trajectory.total_reward - step_rewards if trajectory.success else 0.0


def to_rollout_data(
    trajectories: Sequence[StoredTrajectory], truncated_episodes: TruncationRule = "train",
    *, zero_task_reward: bool = False,
) -> RolloutData:
    """Step records whose per-trajectory reward sums equal each ``total_reward`` (pure).

    Truncated episodes the rule leaves out (see learning_loop.asynchrony) yield nothing:
    no sample, no return in their group's baseline; they are counted. With
    ``zero_task_reward`` (a placebo run) each return is ``total_reward`` less the
    trajectory's ``task_reward``.
    """
    data = RolloutData()
    for trajectory in trajectories:
        if not learns_from(trajectory.status, trajectory.failure_reason, truncated_episodes):
            data.truncated_excluded += 1
            continue
        step_rewards = 0.0
        for step in trajectory.steps:
            check_action_mask(step, trajectory.id)
            data.steps.append(_record(trajectory, step.prompt_token_ids, step.action_token_ids,
                                      step.behaviour_logprobs, step.reward,
                                      step.policy_version))
            step_rewards += step.reward
        # Outcome reward (and any rounding): a record without action tokens adds it to the
        # return without producing a sample (see learning_loop.batch).
        removed = task_reward(trajectory, step_rewards) if zero_task_reward else 0.0
        data.steps.append(_record(trajectory, (), (), (),
                                  trajectory.total_reward - step_rewards - removed))
        data.returns.append(TrajectoryReturn(
            trajectory.id, trajectory.group_id, trajectory.task_id,
            trajectory.total_reward - removed, trajectory.environment, trajectory.success,
        ))
        data.lengths.append(sum(len(s.action_token_ids) for s in trajectory.steps))
        data.policy_versions.append(trajectory.policy_version)
    return data


def _record(
    trajectory: StoredTrajectory, prompt: Sequence[int], action: Sequence[int],
    logprobs: Sequence[float], reward: float, policy_version: int | None = None,
) -> StepRecord:
    # A turn sampled by an older policy than its trajectory's (a continued cut episode)
    # carries its own version, so the off-policy guard judges it by its true age.
    version = trajectory.policy_version if policy_version is None else policy_version
    return StepRecord(
        trajectory_id=trajectory.id, group_id=trajectory.group_id, task_id=trajectory.task_id,
        policy_version=version, prompt_token_ids=list(prompt),
        action_token_ids=list(action), behaviour_logprobs=list(logprobs), reward=reward,
        environment=trajectory.environment,
    )


def load_rollout_data(
    *, engine: Engine, run_id: str, batch_ids: Sequence[str],
    task_environments: Mapping[str, str] | None = None,
    truncated_episodes: TruncationRule = "train",
    held_groups: Sequence[str] = (), carried_groups: Sequence[str] = (),
    zero_task_reward: bool = False,
) -> RolloutData:
    """Read the run's training episodes of these batches, in a stable order.

    ``task_environments`` (the run plan's admitted tasks -> environment name) names each
    trajectory's environment; a trajectory of a task outside it is refused. Partial
    rollouts (learning_loop.partial_rollouts): ``held_groups`` of these batches wait for
    a continuation and are left out; ``carried_groups`` of earlier batches are read whole.
    ``zero_task_reward``: a placebo run's returns, without their task term.
    """
    allowed = task_environments or {}
    in_batches: ColumnElement[bool] = col(Trajectory.batch_id).in_(list(batch_ids))
    if held_groups:
        in_batches = and_(in_batches, col(Trajectory.group_id).not_in(list(held_groups)))
    wanted = or_(in_batches, col(Trajectory.group_id).in_(list(carried_groups))) \
        if carried_groups else in_batches
    with Session(engine) as session:
        rows = list(session.exec(
            select(Trajectory)
            .where(wanted)
            .where(Trajectory.run_id == run_id)
            .where(Trajectory.purpose == Purpose.TRAINING)
            .order_by(col(Trajectory.batch_id), col(Trajectory.id))
        ))
        usable = [t for t in rows if t.status in USABLE_STATUSES and t.num_steps > 0]
        # The learning role reads steps and sequences through ``learning_step`` and
        # ``learning_trajectory_sequence``, views of training episodes only (it has no
        # SELECT on ``step`` or ``trajectory_sequence``: migrations 0011 and 0018).
        steps = session.execute(
            _TRAINING_STEPS, {"ids": [t.id for t in usable]}).mappings().all() if usable else []
        sequences = session.execute(
            _TRAINING_SEQUENCES, {"ids": [t.id for t in usable]}).mappings().all() if usable else []
    by_trajectory = stored_steps(steps, sequences)
    stored = [
        StoredTrajectory(t.id, t.group_id, t.task_id, t.policy_version, t.total_reward,
                         by_trajectory.get(t.id, []), allowed.get(t.task_id, ""), t.status,
                         t.failure_reason, t.success, outcome_reward_terms(t.outcome or {}))
        for t in usable
    ]
    check_admitted(stored, allowed)
    data = to_rollout_data(stored, truncated_episodes, zero_task_reward=zero_task_reward)
    data.skipped = len(rows) - len(usable)
    return data


def stored_steps(
    steps: Sequence[Mapping[Any, Any]], sequences: Sequence[Mapping[Any, Any]]
) -> dict[str, list[StoredStep]]:
    """Each trajectory's steps with their prompt, action and logprobs sliced out of its
    sequence (pure); a layout that does not check out is refused, naming the trajectory."""
    offsets: dict[str, list[tuple[int, TurnOffsets, float, int | None]]] = {}
    for step in steps:
        offsets.setdefault(step["trajectory_id"], []).append((
            int(step["index"]),
            TurnOffsets(int(step["prompt_start"]), int(step["observation_start"]),
                        int(step["action_start"]), int(step["action_end"])),
            float(step["reward"]),
            step.get("policy_version"),
        ))
    packed = {row["trajectory_id"]: row for row in sequences}
    result: dict[str, list[StoredStep]] = {}
    for trajectory_id, rows in offsets.items():
        row = packed.get(trajectory_id)
        if row is None:
            raise InvalidSampleError(
                f"trajectory {trajectory_id!r} has steps but no token sequence")
        sequence = TokenSequence(list(row["token_ids"] or []), list(row["action_mask"] or []),
                                 list(row["behaviour_logprobs"] or []),
                                 list(row["segment_starts"] or []))
        try:
            turns = unpack_turns(sequence, [at for _, at, _, _ in rows])
        except SequenceLayoutError as exc:
            raise InvalidSampleError(f"trajectory {trajectory_id!r}: {exc}") from exc
        result[trajectory_id] = [
            StoredStep(index, turn.prompt_token_ids, turn.action_token_ids,
                       step_action_mask(len(turn.prompt_token_ids), len(turn.action_token_ids)),
                       turn.behaviour_logprobs, reward, version)
            for (index, _, reward, version), turn in zip(rows, turns, strict=True)
        ]
    return result


