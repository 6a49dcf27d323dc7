"""Transcripts: an episode's header, its turns with their token view, and lists of episodes.

What a person reads of a stored episode: each turn's observation and action, the turn's
tokens (which the learner trains on, by the action mask, and the behaviour policy's
logprobs of those), the environment's reward and feedback per step, the verifier's own
verdict and the sandbox record the execution loop kept in ``outcome``. Who may read which
episode is the policy's question (``policies/triloop/authz/transcripts.rego``); the facts it
needs (purpose, the run's submitter) come from ``transcript_facts``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, or_, text
from sqlmodel import Session, col, select

from triloop.models import (
    Promotion,
    RolloutBatch,
    Step,
    TrainingRun,
    Trajectory,
    TrajectorySequence,
)
from triloop.models import Verdict as VerdictRow
from web.pagination import Page, decode_cursor, keyset, page_of

# An id is accepted by a prefix this long at least: shorter ones name too many episodes.
MIN_PREFIX = 8
MAX_CANDIDATES = 5
# What learning's update says when a batch held nothing to learn from (learning_loop.iteration).
_NO_TRAINABLE_DATA = re.compile(r"NoTrainableData: iteration (\d+)\b")


class VerdictView(BaseModel):
    """The verifier's replayed judgement of the episode (what the gates count)."""

    success: bool
    total_reward: float
    agrees: bool = Field(description="execution's own row said the same success and reward")
    details: dict[str, Any]
    recorded_by: str
    created_at: datetime


class TrajectorySummary(BaseModel):
    """One episode in a list."""

    id: str
    batch_id: str
    run_id: str | None = None
    task_id: str
    checkpoint_id: str
    purpose: str
    status: str
    failure_reason: str | None = None
    success: bool
    total_reward: float
    num_steps: int
    created_at: datetime
    verdict_success: bool | None = Field(
        default=None, description="the verifier's success (null: not judged)")


class TrajectoryHeader(TrajectorySummary):
    """An episode with its verdict, its outcome record and the sandbox it ran in."""

    group_id: str
    sample_index: int
    policy_version: int
    submitted_by: str | None = Field(default=None, description="the run's submitter (training)")
    outcome: dict[str, Any]
    sandbox: dict[str, Any] | None = Field(
        default=None, description="the sandbox record execution stored in outcome, if any")
    verdict: VerdictView | None = None


class TokenView(BaseModel):
    """A turn's tokens as generated: the context this turn added, then its action."""

    token_ids: list[int]
    trained: list[int] = Field(description="1 where the learner trains (the action mask)")
    behaviour_logprobs: list[float | None] = Field(
        description="the behaviour policy's logprob per trained token; null elsewhere")
    action_start: int = Field(description="index in token_ids where the action begins")


class TurnView(BaseModel):
    """One turn: what the agent saw, what it did, and what the environment answered."""

    index: int
    observation: str
    action_text: str
    reward: float
    done: bool
    feedback: dict[str, Any]
    policy_version: int | None = None
    tokens: TokenView | None = Field(default=None, description="null: no tokens stored")


class TurnPage(Page[TurnView]):
    """A page of turns, in order."""

    trajectory_id: str
    num_steps: int


@dataclass(frozen=True)
class TranscriptFacts:
    """What the policy needs to decide a read: the episode's purpose and run submitter."""

    id: str
    purpose: str
    submitted_by: str | None

    def policy_attrs(self) -> dict[str, str]:
        """The facts as ``resource.attrs``."""
        attrs = {"purpose": self.purpose}
        if self.submitted_by:
            attrs["submitted_by"] = self.submitted_by
        return attrs


class AmbiguousTrajectory(Exception):
    """A prefix that starts more than one episode id."""

    def __init__(self, ref: str, candidates: Sequence[str]) -> None:
        super().__init__(f"{ref!r} starts more than one episode id "
                         f"({', '.join(candidates)}); give more characters")
        self.candidates = list(candidates)


def resolve_trajectory(*, session: Session, ref: str) -> str | None:
    """The one episode id ``ref`` is, or starts (at least ``MIN_PREFIX`` characters)."""
    if session.get(Trajectory, ref) is not None:
        return ref
    if len(ref) < MIN_PREFIX:
        return None
    found = list(session.exec(
        select(Trajectory.id).where(col(Trajectory.id).startswith(ref, autoescape=True))
        .order_by(col(Trajectory.id)).limit(MAX_CANDIDATES + 1)).all())
    if len(found) > 1:
        raise AmbiguousTrajectory(ref, found[:MAX_CANDIDATES])
    return found[0] if found else None


def transcript_facts(*, session: Session, trajectory_id: str) -> TranscriptFacts | None:
    """The policy's facts about one stored episode."""
    row = session.exec(
        select(Trajectory.purpose, TrainingRun.submitted_by)
        .select_from(Trajectory)
        .join(TrainingRun, col(TrainingRun.id) == col(Trajectory.run_id), isouter=True)
        .where(Trajectory.id == trajectory_id)).one_or_none()
    if row is None:
        return None
    return TranscriptFacts(trajectory_id, str(row[0]), row[1])


def run_submitter(*, session: Session, run_id: str) -> str | None:
    """Who submitted a run (None: no such run)."""
    run = session.get(TrainingRun, run_id)
    return None if run is None else run.submitted_by


def batch_purpose(*, session: Session, batch_id: str) -> str | None:
    """What a requested batch was for (None: no such batch)."""
    batch = session.get(RolloutBatch, batch_id)
    return None if batch is None else batch.purpose


def _verdicts(session: Session, ids: Sequence[str]) -> dict[str, VerdictRow]:
    if not ids:
        return {}
    rows = session.exec(select(VerdictRow).where(col(VerdictRow.trajectory_id).in_(ids))).all()
    return {row.trajectory_id: row for row in rows}


def _summary(row: Trajectory, verdict: VerdictRow | None) -> dict[str, Any]:
    return {**row.model_dump(exclude={"outcome", "group_id", "sample_index",
                                      "policy_version"}),
            "verdict_success": None if verdict is None else verdict.success}


def trajectory_header(*, session: Session, trajectory_id: str) -> TrajectoryHeader | None:
    """An episode's header: what ran, how it ended, the verdict and the sandbox record."""
    row = session.get(Trajectory, trajectory_id)
    if row is None:
        return None
    verdict = session.get(VerdictRow, trajectory_id)
    outcome = dict(row.outcome or {})
    sandbox = outcome.get("sandbox")
    agent = outcome.get("agent")
    if isinstance(agent, dict) and isinstance(agent.get("sandbox"), dict):
        sandbox = {**(sandbox if isinstance(sandbox, dict) else {}), "agent": agent["sandbox"]}
    return TrajectoryHeader(
        **_summary(row, verdict), group_id=row.group_id, sample_index=row.sample_index,
        policy_version=row.policy_version, outcome=outcome,
        submitted_by=None if row.run_id is None else run_submitter(session=session,
                                                                      run_id=row.run_id),
        sandbox=sandbox if isinstance(sandbox, dict) else None,
        verdict=None if verdict is None else VerdictView.model_validate(
            verdict, from_attributes=True))


def _token_view(sequence: TrajectorySequence | None, trained_before: list[int],
                step: Step) -> TokenView | None:
    if sequence is None or step.action_end <= step.observation_start:
        return None
    start, end = step.observation_start, step.action_end
    mask = list(sequence.action_mask[start:end])
    logprobs: list[float | None] = []
    at = trained_before[start]  # behaviour_logprobs holds one per trained token, in order
    for flag in mask:
        if flag and at < len(sequence.behaviour_logprobs):
            logprobs.append(float(sequence.behaviour_logprobs[at]))
            at += 1
        else:
            logprobs.append(None)
    return TokenView(token_ids=list(sequence.token_ids[start:end]), trained=mask,
                     behaviour_logprobs=logprobs, action_start=step.action_start - start)


def trajectory_turns(
    *, session: Session, trajectory_id: str, limit: int, cursor: str | None,
) -> TurnPage | None:
    """A page of an episode's turns in order, each with its token view."""
    row = session.get(Trajectory, trajectory_id)
    if row is None:
        return None
    statement = select(Step).where(Step.trajectory_id == trajectory_id)
    if cursor is not None:
        (after,) = decode_cursor(cursor, [int])
        statement = statement.where(col(Step.index) > after)
    steps = list(session.exec(statement.order_by(col(Step.index)).limit(limit + 1)).all())
    sequence = session.get(TrajectorySequence, trajectory_id)
    trained_before = ([0, *accumulate(int(bool(m)) for m in sequence.action_mask)]
                      if sequence is not None else [])

    def turn(step: Step) -> TurnView:
        return TurnView(index=step.index, observation=step.observation,
                        action_text=step.action_text, reward=step.reward, done=step.done,
                        feedback=dict(step.feedback or {}), policy_version=step.policy_version,
                        tokens=_token_view(sequence, trained_before, step))

    shown = page_of(steps, limit, lambda s: (s.index,), turn)
    return TurnPage(items=shown.items, next_cursor=shown.next_cursor,
                    trajectory_id=trajectory_id, num_steps=row.num_steps)


def iteration_batches(*, session: Session, run_id: str, iteration: int) -> list[str]:
    """The training batches a run asked for in one iteration (``<run>-<i>[r<k>]-<nonce>``)."""
    shape = re.compile(rf"{re.escape(run_id)}-{iteration}(r\d+)?-[0-9a-f]+")
    ids = session.exec(select(RolloutBatch.id).where(RolloutBatch.run_id == run_id)).all()
    return sorted(i for i in ids if shape.fullmatch(i))


def promotion_batches(*, session: Session, workflow_id: str | None) -> list[str]:
    """The eval batches a promotion's workflow asked for (``<workflow>-eval-<nonce>-<arm>``)."""
    if not workflow_id:
        return []
    rows = session.execute(text(
        "SELECT id FROM rollout_batch WHERE purpose = 'eval' AND starts_with(id, :p)"),
        {"p": f"{workflow_id}-eval-"}).all()
    return sorted(str(r[0]) for r in rows)


@dataclass(frozen=True)
class PromotionScope:
    """Which episodes are a promotion's: its eval batches, its candidate's shadow/canary."""

    batch_ids: list[str]
    candidate: str


def promotion_scope(*, session: Session, promotion_id: str) -> PromotionScope | None:
    """The promotion's episodes, as a filter (None: no such promotion)."""
    row = session.get(Promotion, promotion_id)
    if row is None:
        return None
    return PromotionScope(promotion_batches(session=session, workflow_id=row.workflow_id),
                          row.checkpoint_id)


@dataclass(frozen=True)
class EpisodeFilter:
    """Which episodes a list shows (every field optional; all must hold)."""

    run_id: str | None = None
    checkpoint_id: str | None = None
    purpose: str | None = None
    batch_ids: tuple[str, ...] | None = None  # None: any batch
    task_id: str | None = None
    status: str | None = None
    candidate_of: str | None = None  # with batch_ids: also this checkpoint's shadow/canary
    judged_only: bool = False  # leave training episodes out


def list_trajectories(
    *, session: Session, limit: int, cursor: str | None, where: EpisodeFilter,
) -> Page[TrajectorySummary]:
    """Episodes, newest first."""
    statement = select(Trajectory)
    for column, value in ((Trajectory.run_id, where.run_id),
                          (Trajectory.checkpoint_id, where.checkpoint_id),
                          (Trajectory.purpose, where.purpose), (Trajectory.task_id, where.task_id),
                          (Trajectory.status, where.status)):
        if value is not None:
            statement = statement.where(column == value)
    if where.judged_only:
        statement = statement.where(Trajectory.purpose != "training")
    if where.batch_ids is not None:
        in_batches: ColumnElement[bool] = col(Trajectory.batch_id).in_(list(where.batch_ids))
        if where.candidate_of is not None:
            served = (col(Trajectory.checkpoint_id) == where.candidate_of) & col(
                Trajectory.purpose).in_(["shadow", "canary"])
            in_batches = or_(in_batches, served)
        statement = statement.where(in_batches)
    statement = keyset(statement, [col(Trajectory.created_at), col(Trajectory.id)], cursor,
                       [datetime, str], limit)
    rows = list(session.exec(statement).all())
    verdicts = _verdicts(session, [r.id for r in rows])
    return page_of(rows, limit, lambda r: (r.created_at, r.id),
                   lambda r: TrajectorySummary(**_summary(r, verdicts.get(r.id))))


def no_trainable_data_iteration(reason: str | None) -> int | None:
    """The iteration a run's ``NoTrainableData`` failure names, if its reason is one."""
    found = _NO_TRAINABLE_DATA.search(reason or "")
    return int(found.group(1)) if found else None

