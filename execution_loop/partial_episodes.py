"""Continuing a cut episode (partial rollouts): the stored turns it resumes from.

A training episode the batch deadline cut is continued in the run's next batch under a
newer policy. The continuation's activity reads the cut episode's steps here, replays
their actions on a freshly reset environment (``execution_loop.episode.replay``) and
plays on. Each replayed turn keeps the policy version that sampled it, so the learner's
off-policy guard sees every turn's true age.

Only a training episode of the same run, task and group may be continued: a batch cannot
borrow another run's turns, nor a production or eval episode's.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine
from sqlmodel import Session

from execution_loop.episode import StepRecord
from execution_loop.store import load_steps, load_turn_tokens
from triloop.models import Step, Trajectory
from triloop.token_sequence import TurnTokens, step_action_mask


class ContinuationRefused(Exception):
    """The episode named to continue is not a cut training episode of this run and group."""


@dataclass(frozen=True)
class PriorEpisode:
    """The turns a continuation resumes from, and the policy version of each."""

    steps: list[StepRecord]
    versions: list[int]


def as_record(step: Step, tokens: TurnTokens) -> StepRecord:
    """A stored step and its tokens (sliced out of the trajectory's sequence) as the episode
    loop's record (``finish_reason`` lives in feedback)."""
    feedback = dict(step.feedback or {})
    finish_reason = str(feedback.pop("finish_reason", "stop"))
    prompt, action = list(tokens.prompt_token_ids), list(tokens.action_token_ids)
    return StepRecord(
        index=step.index, prompt_token_ids=prompt, action_token_ids=action,
        action_mask=step_action_mask(len(prompt), len(action)),
        behaviour_logprobs=list(tokens.behaviour_logprobs), observation=step.observation,
        action_text=step.action_text, reward=step.reward, done=step.done, feedback=feedback,
        finish_reason=finish_reason,
    )


def check_continuable(prior: Trajectory | None, *, prior_id: str, run_id: str | None,
                      task_id: str, group_id: str) -> Trajectory:
    """``prior`` if a continuation of ``run_id``'s group may resume from it (pure)."""
    if prior is None:
        raise ContinuationRefused(f"episode {prior_id!r} to continue is not stored")
    problems = []
    if prior.purpose != "training" or prior.run_id is None or prior.run_id != run_id:
        problems.append("it is not a training episode of this run")
    if prior.task_id != task_id or prior.group_id != group_id:
        problems.append("it is of another task or group")
    if prior.status != "truncated":
        problems.append(f"it is {prior.status}, not cut")
    if problems:
        raise ContinuationRefused(f"episode {prior_id!r} cannot be continued: "
                                  + "; ".join(problems))
    return prior


def load_prior_episode(*, engine: Engine, prior_id: str, run_id: str | None, task_id: str,
                       group_id: str) -> PriorEpisode:
    """The cut episode's turns, after checking it may be continued."""
    with Session(engine) as session:
        prior = check_continuable(session.get(Trajectory, prior_id), prior_id=prior_id,
                                  run_id=run_id, task_id=task_id, group_id=group_id)
        steps = load_steps(session=session, trajectory_id=prior_id)
        tokens = load_turn_tokens(session=session, trajectory_id=prior_id)
        version = prior.policy_version
    return PriorEpisode(
        steps=[as_record(s, t) for s, t in zip(steps, tokens, strict=True)],
        versions=[version if s.policy_version is None else s.policy_version for s in steps],
    )
