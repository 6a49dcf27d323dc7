"""The training-sample format: stored steps -> samples with advantages -> padded tensors.

A rollout stores one `step` row per model turn: the full context fed to the model at that
turn (`prompt_token_ids`, exactly as generated, never retokenized), the tokens the model
sampled (`action_token_ids`), the behaviour policy's logprob of each sampled token and
the step's reward. A training sample is prompt + action with the action mask = 1 on the
action tokens only, so observations, tool output and templates never receive gradient.

Targets are aligned with the logits: position t of `action_mask` / `behaviour_logprobs`
refers to token t+1 of `input_ids`, the token predicted by the logits at position t.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from learning_loop.advantages import AdvantageResult, TrajectoryTurns, compute_turn_advantages
from triloop.run_config import AdvantageConfig


class InvalidSampleError(ValueError):
    """A step or sample that cannot be trained on; the message names it and says why."""


@dataclass(frozen=True)
class StepRecord:
    """One stored rollout step, as the execution loop wrote it."""

    trajectory_id: str
    group_id: str
    task_id: str
    policy_version: int
    prompt_token_ids: Sequence[int]
    action_token_ids: Sequence[int]
    behaviour_logprobs: Sequence[float]
    reward: float
    environment: str = ""  # the environment's name (environment-level normalisation)


@dataclass(frozen=True)
class TrainingSample:
    """prompt + action token ids, the behaviour logprobs of the action, its advantage."""

    trajectory_id: str
    group_id: str
    task_id: str
    policy_version: int
    prompt_token_ids: tuple[int, ...]
    action_token_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    advantage: float
    # Per action token weight on the policy-gradient term; set by the update only for stale
    # samples it importance-corrects (then behaviour_logprobs hold the proximal logprobs).
    importance_weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        where = f"sample of trajectory {self.trajectory_id!r}"
        if not self.prompt_token_ids:
            raise InvalidSampleError(f"{where}: empty prompt; the first action token needs context")
        if not self.action_token_ids:
            raise InvalidSampleError(f"{where}: no action tokens to train on")
        if len(self.behaviour_logprobs) != len(self.action_token_ids):
            raise InvalidSampleError(
                f"{where}: {len(self.behaviour_logprobs)} behaviour logprobs for"
                f" {len(self.action_token_ids)} action tokens; the rollout must store one each"
            )
        if min(self.prompt_token_ids) < 0 or min(self.action_token_ids) < 0:
            raise InvalidSampleError(f"{where}: negative token id")
        if not all(math.isfinite(lp) and lp <= 1e-4 for lp in self.behaviour_logprobs):
            raise InvalidSampleError(f"{where}: behaviour logprobs must be finite and <= 0")
        weights = self.importance_weights
        if weights is not None and len(weights) != len(self.action_token_ids):
            raise InvalidSampleError(f"{where}: one importance weight per action token needed")
        if not math.isfinite(self.advantage):
            raise InvalidSampleError(f"{where}: non-finite advantage {self.advantage!r}")

    @property
    def length(self) -> int:
        """Tokens in the sample (prompt + action)."""
        return len(self.prompt_token_ids) + len(self.action_token_ids)


def build_training_samples(
    steps: Sequence[StepRecord], config: AdvantageConfig
) -> tuple[list[TrainingSample], AdvantageResult]:
    """Turn stored steps into samples, one per turn, with the turn's advantage.

    A turn is a step with action tokens. Steps without action tokens (the outcome
    reward record the reader appends) add their reward to the turn before them, or to
    the first turn when none came before; they yield no sample. How a turn's advantage
    follows from the turn rewards is `config.credit` (see learning_loop.advantages).
    """
    result = compute_turn_advantages(trajectory_turns(steps), config)
    turn_of: dict[str, int] = {}
    samples: list[TrainingSample] = []
    for s in steps:
        if not s.action_token_ids:
            continue
        index = turn_of.get(s.trajectory_id, 0)
        turn_of[s.trajectory_id] = index + 1
        samples.append(TrainingSample(
            trajectory_id=s.trajectory_id,
            group_id=s.group_id,
            task_id=s.task_id,
            policy_version=s.policy_version,
            prompt_token_ids=tuple(s.prompt_token_ids),
            action_token_ids=tuple(s.action_token_ids),
            behaviour_logprobs=tuple(float(x) for x in s.behaviour_logprobs),
            advantage=result.turn_advantages[s.trajectory_id][index],
        ))
    return samples, result


def without_groups(
    samples: Sequence[TrainingSample], group_ids: Collection[str]
) -> list[TrainingSample]:
    """The samples outside these groups (dynamic sampling drops zero-variance groups, so
    their zero-advantage tokens leave the token-aggregated loss's denominator)."""
    return [s for s in samples if s.group_id not in group_ids]


def trajectory_turns(steps: Sequence[StepRecord]) -> list[TrajectoryTurns]:
    """Each trajectory's turn rewards, in first-seen order (reward-only records folded in)."""
    first: dict[str, StepRecord] = {}
    rewards: dict[str, list[float]] = {}
    pending: dict[str, float] = {}  # reward-only records before the first turn
    for step in steps:
        head = first.setdefault(step.trajectory_id, step)
        if (head.group_id, head.task_id) != (step.group_id, step.task_id):
            raise InvalidSampleError(
                f"trajectory {step.trajectory_id!r} has steps in different groups or tasks"
            )
        turns = rewards.setdefault(step.trajectory_id, [])
        if step.action_token_ids:
            turns.append(step.reward + pending.pop(step.trajectory_id, 0.0))
        elif turns:
            turns[-1] += step.reward
        else:
            pending[step.trajectory_id] = pending.get(step.trajectory_id, 0.0) + step.reward
    for tid, reward in pending.items():  # a trajectory without a single turn
        rewards[tid].append(reward)
    return [
        TrajectoryTurns(tid, first[tid].group_id, first[tid].task_id, tuple(turns),
                        first[tid].environment)
        for tid, turns in rewards.items()
    ]


@dataclass(frozen=True)
class PaddedBatch:
    """Right-padded tensors for a list of samples; targets aligned with logits[:, :-1]."""

    input_ids: torch.Tensor  # [B, L] int64
    attention_mask: torch.Tensor  # [B, L] int64, 1 on real tokens
    action_mask: torch.Tensor  # [B, L-1] float32, 1 where the target token is an action
    behaviour_logprobs: torch.Tensor  # [B, L-1] float32, 0 off the action mask
    advantages: torch.Tensor  # [B] float32
    importance_weights: torch.Tensor  # [B, L-1] float32, 1 unless importance-corrected

    def to(self, device: torch.device) -> PaddedBatch:
        """The same batch on `device`."""
        return PaddedBatch(*(t.to(device) for t in self.tensors()))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """All tensors in field order."""
        return (
            self.input_ids, self.attention_mask, self.action_mask,
            self.behaviour_logprobs, self.advantages, self.importance_weights,
        )


def collate(samples: Sequence[TrainingSample], *, pad_token_id: int = 0) -> PaddedBatch:
    """Right-pad samples into one batch (padding is masked out of attention and loss)."""
    if not samples:
        raise InvalidSampleError("cannot collate an empty list of samples")
    width = max(s.length for s in samples)
    input_ids = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    action_mask = torch.zeros((len(samples), width - 1), dtype=torch.float32)
    behaviour = torch.zeros((len(samples), width - 1), dtype=torch.float32)
    weights = torch.ones((len(samples), width - 1), dtype=torch.float32)
    for row, s in enumerate(samples):
        prompt, action = len(s.prompt_token_ids), len(s.action_token_ids)
        input_ids[row, : prompt + action] = torch.tensor(
            s.prompt_token_ids + s.action_token_ids, dtype=torch.long
        )
        attention[row, : prompt + action] = 1
        # Action token k sits at input position prompt + k, predicted at position prompt + k - 1.
        action_mask[row, prompt - 1 : prompt - 1 + action] = 1.0
        behaviour[row, prompt - 1 : prompt - 1 + action] = torch.tensor(
            s.behaviour_logprobs, dtype=torch.float32
        )
        if s.importance_weights is not None:
            weights[row, prompt - 1 : prompt - 1 + action] = torch.tensor(
                s.importance_weights, dtype=torch.float32
            )
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return PaddedBatch(input_ids, attention, action_mask, behaviour, advantages, weights)
