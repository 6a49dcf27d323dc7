"""``/api/trajectories``: episodes' transcripts (header, turns with tokens), lists of episodes,
and ``/api/promotions/{id}/transcripts``, the sample an auditor reads before signing.

Every read names the episode's purpose (and a training episode's run submitter) to the
policy, which lets auditors and operators read judged episodes and an ML engineer their own
run's training episodes (``transcripts.rego``); each allowed read lands in the access log.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Query

from triloop.statuses import EpisodeStatus, Purpose
from web.api.common import ERRORS, Short
from web.data import transcripts
from web.data.transcript_sample import TranscriptSample, transcript_sample
from web.data.transcripts import (
    AmbiguousTrajectory,
    EpisodeFilter,
    TrajectoryHeader,
    TrajectorySummary,
    TranscriptFacts,
    TurnPage,
)
from web.deps import AuthorizeDep, Guard, SessionDep, Sessions
from web.pagination import CursorParam, LimitParam, Page
from web.problems import conflict, invalid, not_found
from web.query import DIGITS_ONLY

router = APIRouter(tags=["trajectories"])
AMBIGUOUS: dict[int | str, dict[str, Any]] = {
    409: {**ERRORS[409], "description": "The prefix starts more than one episode id"}}
TURN_LIMIT = 20  # turns per page unless asked: long episodes page


async def authorize_transcript(guard: Guard, db: Sessions, ref: str) -> TranscriptFacts:
    """Resolve ``ref`` to one episode and ask the policy whether this person may read it."""
    await guard.screen("read", "trajectory", id=ref)
    try:
        found = await db.read(transcripts.resolve_trajectory, ref=ref)
    except AmbiguousTrajectory as ambiguous:
        raise conflict(str(ambiguous)) from ambiguous
    facts = None if found is None else await db.read(transcripts.transcript_facts,
                                                     trajectory_id=found)
    if facts is None:
        raise not_found("trajectory", ref)
    await guard("read", "trajectory", id=facts.id, attrs=facts.policy_attrs())
    return facts


@router.get("/api/trajectories", response_model=Page[TrajectorySummary],
            operation_id="listTrajectories", responses={404: {
                **ERRORS[404], "description": "No such run, rollout batch or promotion"}})
async def list_trajectories(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    run_id: Short | None = None, promotion_id: Short | None = None,
    checkpoint_id: Short | None = None, purpose: Purpose | None = None,
    batch_id: Short | None = None, task_id: Short | None = None,
    status: EpisodeStatus | None = None,
    iteration: Annotated[int | None, Query(ge=0, le=2**31 - 1, description=(
        "with run_id: only that iteration's training batches")), DIGITS_ONLY] = None,
) -> Page[TrajectorySummary]:
    """Episodes, newest first. A list names what it is of (purpose, run_id, batch_id or
    promotion_id): that decides who may read it, and it shows only episodes of that kind."""
    await guard.screen("read", "trajectory")
    if iteration is not None and run_id is None:
        raise invalid("iteration needs run_id: it names one of that run's iterations")
    if promotion_id is not None and (run_id is not None or batch_id is not None):
        raise invalid("promotion_id lists that promotion's episodes; leave out run_id and "
                      "batch_id")
    where = EpisodeFilter(run_id=run_id, checkpoint_id=checkpoint_id, task_id=task_id,
                          purpose=purpose, status=status,
                          batch_ids=None if batch_id is None else (batch_id,))
    of: str | None = purpose
    if batch_id is not None and of is None:
        of = await db.read(transcripts.batch_purpose, batch_id=batch_id)
        if of is None:
            raise not_found("rollout batch", batch_id)
    if promotion_id is not None:
        scope = await db.read(transcripts.promotion_scope, promotion_id=promotion_id)
        if scope is None:
            raise not_found("promotion", promotion_id)
        where = replace(where, batch_ids=tuple(scope.batch_ids), candidate_of=scope.candidate)
        of = of or Purpose.EVAL
    if run_id is not None:
        of = of or Purpose.TRAINING
        if iteration is not None:
            where = replace(where, batch_ids=tuple(await db.read(
                transcripts.iteration_batches, run_id=run_id, iteration=iteration)))
    if of is None:
        raise invalid("name which episodes to list: purpose, run_id, batch_id or promotion_id "
                      "(who may read a list depends on what it is of)")
    if purpose is None:  # show only the kind of episode the policy was asked about
        where = (replace(where, purpose=Purpose.TRAINING) if of == Purpose.TRAINING
                 else replace(where, judged_only=True))
    attrs = {"purpose": str(of)}
    if run_id is not None:
        submitter = await db.read(transcripts.run_submitter, run_id=run_id)
        if submitter is None:
            raise not_found("training run", run_id)
        attrs["submitted_by"] = submitter
    scope_attrs = {k: v for k, v in (("run_id", run_id), ("promotion_id", promotion_id),
                                     ("batch_id", batch_id)) if v}
    await guard("read", "trajectory", attrs={**attrs, **scope_attrs})
    return await db.read(transcripts.list_trajectories, limit=limit, cursor=cursor, where=where)


@router.get("/api/trajectories/{trajectory_id}", response_model=TrajectoryHeader,
            operation_id="getTrajectory", responses=AMBIGUOUS)
async def get_trajectory(trajectory_id: str, guard: AuthorizeDep, db: SessionDep
                         ) -> TrajectoryHeader:
    """An episode: task, checkpoint, purpose, how it ended, the verifier's verdict and the
    sandbox record (an id or a unique prefix of at least 8 characters)."""
    facts = await authorize_transcript(guard, db, trajectory_id)
    header = await db.read(transcripts.trajectory_header, trajectory_id=facts.id)
    if header is None:
        raise not_found("trajectory", trajectory_id)
    return header


@router.get("/api/trajectories/{trajectory_id}/turns", response_model=TurnPage,
            operation_id="listTrajectoryTurns",
            responses=AMBIGUOUS)
async def list_trajectory_turns(
    trajectory_id: str, guard: AuthorizeDep, db: SessionDep,
    limit: LimitParam = TURN_LIMIT, cursor: CursorParam = None,
) -> TurnPage:
    """An episode's turns in order: observation, action, reward, feedback and tokens (which
    are trained, and the behaviour logprobs), paged."""
    facts = await authorize_transcript(guard, db, trajectory_id)
    turns = await db.read(transcripts.trajectory_turns, trajectory_id=facts.id, limit=limit,
                          cursor=cursor)
    if turns is None:
        raise not_found("trajectory", trajectory_id)
    return turns


@router.get("/api/promotions/{promotion_id}/transcripts", response_model=TranscriptSample,
            operation_id="getPromotionTranscripts", tags=["promotions"])
async def get_promotion_transcripts(
    promotion_id: str, guard: AuthorizeDep, db: SessionDep
) -> TranscriptSample:
    """The stratified sample an auditor reads before signing: per eval task, the candidate's
    and the baseline's episodes side by side, a success and a failure of each; the same on
    every call."""
    await guard("read", "promotion", id=promotion_id)
    await guard("read", "trajectory", attrs={"purpose": Purpose.EVAL,
                                             "promotion_id": promotion_id})
    sample = await db.read(transcript_sample, promotion_id=promotion_id)
    if sample is None:
        raise not_found("promotion", promotion_id)
    return sample
