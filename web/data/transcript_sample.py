"""The transcripts an auditor is shown before signing, and the ones they read.

The sample is stratified and deterministic: per eval task of the promotion's offline eval,
the candidate's and the baseline's episodes side by side, one success and one failure of
each arm where there is one. Tasks where the two arms disagree come first; within that,
tasks and episodes are ordered by ``sha256(promotion id, id)``, so every page load shows the
same sample and no choice of the page (or of the person) decides what is shown.

What a person *read* is never what the client says: ``shown_transcripts`` takes it from
that person's own rows in the access log (``access_event``), the episodes of this promotion
they opened since it was created.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlmodel import Session, col, select

from triloop.models import GateResult, Promotion, RolloutBatch, Trajectory
from triloop.models import Verdict as VerdictRow
from web.data.transcripts import TrajectorySummary, promotion_batches

MAX_TASKS = 6


class ArmSample(BaseModel):
    """One arm's episodes of one task: how many, how many succeeded, and the sampled two."""

    checkpoint_id: str
    episodes: int
    successes: int
    success: TrajectorySummary | None = Field(default=None, description="a successful episode")
    failure: TrajectorySummary | None = Field(default=None, description="a failed episode")


class TaskSample(BaseModel):
    """One eval task: the candidate and the baseline side by side."""

    task_id: str
    candidate: ArmSample
    baseline: ArmSample | None = None


class TranscriptSample(BaseModel):
    """The stratified sample of a promotion's offline-eval transcripts."""

    promotion_id: str
    candidate_batch_id: str | None = None
    baseline_batch_id: str | None = None
    tasks_total: int = Field(description="eval tasks the candidate played")
    tasks: list[TaskSample]

    @property
    def trajectory_ids(self) -> list[str]:
        """Every sampled episode id, in page order."""
        ids: list[str] = []
        for task in self.tasks:
            for arm in (task.candidate, task.baseline):
                for episode in (arm.success, arm.failure) if arm else ():
                    if episode is not None:
                        ids.append(episode.id)
        return ids


def _order(promotion_id: str, key: str) -> str:
    return hashlib.sha256(f"{promotion_id}\x00{key}".encode()).hexdigest()


def _eval_batches(session: Session, promotion: Promotion) -> tuple[str | None, str | None]:
    """(candidate, baseline) batches of the newest offline eval, as its gate bound them."""
    gates = session.exec(select(GateResult).where(GateResult.promotion_id == promotion.id)
                         .where(GateResult.gate == "offline_eval")
                         .order_by(col(GateResult.created_at).desc())).all()
    for gate in gates:
        bound = (gate.evidence or {}).get("batches_bound") or {}
        if bound.get("candidate"):
            return str(bound["candidate"]), bound.get("production")
    # No gate recorded them (yet): the newest candidate batch the workflow asked for.
    ids = promotion_batches(session=session, workflow_id=promotion.workflow_id)
    batches = [session.get(RolloutBatch, i) for i in ids if i.endswith("-candidate")]
    newest = max((b for b in batches if b is not None), key=lambda b: (b.created_at, b.id),
                 default=None)
    if newest is None:
        return None, None
    baseline = newest.id.removesuffix("-candidate") + "-production"
    return newest.id, baseline if baseline in ids else None


def _arm(session: Session, batch_id: str | None, checkpoint_id: str | None
         ) -> dict[str, list[tuple[TrajectorySummary, bool]]]:
    """Task id -> the arm's episodes with their judged success (the verifier's when judged)."""
    if batch_id is None or checkpoint_id is None:
        return {}
    rows = session.exec(select(Trajectory, VerdictRow).join(
        VerdictRow, col(VerdictRow.trajectory_id) == col(Trajectory.id), isouter=True)
        .where(Trajectory.batch_id == batch_id, Trajectory.checkpoint_id == checkpoint_id)).all()
    by_task: dict[str, list[tuple[TrajectorySummary, bool]]] = defaultdict(list)
    for row, verdict in rows:
        judged = verdict.success if verdict is not None else row.success
        summary = TrajectorySummary(
            **row.model_dump(exclude={"outcome", "group_id", "sample_index", "policy_version"}),
            verdict_success=None if verdict is None else verdict.success)
        by_task[row.task_id].append((summary, judged))
    return by_task


def _sample_arm(promotion_id: str, checkpoint_id: str,
                episodes: list[tuple[TrajectorySummary, bool]]) -> ArmSample:
    ordered = sorted(episodes, key=lambda e: _order(promotion_id, e[0].id))
    return ArmSample(
        checkpoint_id=checkpoint_id, episodes=len(ordered),
        successes=sum(1 for _, ok in ordered if ok),
        success=next((e for e, ok in ordered if ok), None),
        failure=next((e for e, ok in ordered if not ok), None))


def transcript_sample(*, session: Session, promotion_id: str) -> TranscriptSample | None:
    """The promotion's sample (None: no such promotion; no tasks: no eval episodes yet)."""
    promotion = session.get(Promotion, promotion_id)
    if promotion is None:
        return None
    candidate_batch, baseline_batch = _eval_batches(session, promotion)
    mine = _arm(session, candidate_batch, promotion.checkpoint_id)
    theirs = _arm(session, baseline_batch, promotion.baseline_checkpoint_id)

    def rate(episodes: list[tuple[Any, bool]]) -> float:
        return sum(ok for _, ok in episodes) / len(episodes) if episodes else 0.0

    def disagree(task: str) -> bool:
        return task in theirs and rate(mine[task]) != rate(theirs[task])

    tasks = sorted(mine, key=lambda t: (not disagree(t), _order(promotion_id, t)))[:MAX_TASKS]
    samples = [TaskSample(
        task_id=task, candidate=_sample_arm(promotion_id, promotion.checkpoint_id, mine[task]),
        baseline=(_sample_arm(promotion_id, promotion.baseline_checkpoint_id, theirs[task])
                  if task in theirs and promotion.baseline_checkpoint_id else None))
        for task in tasks]
    return TranscriptSample(promotion_id=promotion_id, candidate_batch_id=candidate_batch,
                            baseline_batch_id=baseline_batch, tasks_total=len(mine),
                            tasks=samples)


_SHOWN_SQL = text("""
SELECT a.resource->>'id' AS id, min(a.id) AS first_read
FROM access_event a
JOIN trajectory t ON t.id = a.resource->>'id'
WHERE a.action = 'read' AND a.resource->>'kind' = 'trajectory'
  AND a.actor->>'service' = 'web' AND a.actor->>'user' = :user
  AND a.at >= :since
  AND (t.batch_id = ANY(:batches)
       OR (t.checkpoint_id = :candidate AND t.purpose IN ('shadow', 'canary')))
GROUP BY a.resource->>'id'
ORDER BY first_read
""")


def shown_transcripts(*, session: Session, promotion_id: str, user: str) -> list[str]:
    """The episodes of this promotion ``user`` read, from their own access-log rows, in the
    order they first opened them."""
    promotion = session.get(Promotion, promotion_id)
    if promotion is None:
        return []
    batches = promotion_batches(session=session, workflow_id=promotion.workflow_id)
    rows = session.execute(_SHOWN_SQL, {
        "user": user, "since": promotion.created_at, "batches": batches,
        "candidate": promotion.checkpoint_id}).all()
    return [str(r[0]) for r in rows]
