"""How far a training run is, and what it proposed: "iteration n of N", elapsed time, an
estimate of the time left, the sign that its rollouts are starved, and at the end the
candidates it proposed with the promotions governance opened for them.

``run_progress`` is pure (the clock comes in as ``now``); the console's run page, the API
(``RunDetail.progress``, ``RunMetrics.progress``) and ``triloop train show --wait`` all show
what it returns, so the three say the same thing.

Rollouts are starved when the learner waits on the execution loop instead of learning:

1. the last iteration's batch lost a quarter or more of its episodes (failed, never
   started, or cut by the clock and left out: ``metrics.batch.skipped`` and
   ``truncated_excluded``), so the update learnt from what little came back; or
2. an active run has gone longer without an iteration than a batch's budget
   (``rollout.deadline_s``) plus one usual iteration: a batch returns what finished by its
   deadline, so by then it should have come back (no execution worker, or all busy).
   Before its first iteration, whose update also loads the model, "one usual iteration"
   is one more budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

from triloop.models import Checkpoint, Promotion, Proposal, TrainingStep
from triloop.statuses import FINISHED_RUN_STATUSES, RunStatus

# A batch that lost this share of its episodes or more starved the update (see above).
STARVED_LOSS_SHARE = 0.25
# Iterations whose timing the estimate reads: recent enough to follow a run that sped up.
TIMED_ITERATIONS = 10
# A run in one of these is waiting on its rollouts when no iteration arrives.
_ITERATING = (RunStatus.starting, RunStatus.running)
# RunConfig's defaults (triloop.run_config), for a stored config that lacks the key.
_DEFAULT_ITERATIONS, _DEFAULT_DEADLINE_S = 10, 600.0


class RolloutStarvation(BaseModel):
    """Why the run's rollouts look starved, in words a person can act on."""

    kind: str = Field(description="lost_episodes (the last batch came back short) | "
                                  "no_batch (no iteration for longer than a batch's budget)")
    message: str
    iteration: int | None = Field(default=None, description="the short batch's iteration")
    waiting_s: float | None = Field(default=None, description="seconds since the last "
                                                              "iteration (or the start)")


class RunProgress(BaseModel):
    """Where a run is: n of N, elapsed, the estimate, and whether its rollouts are starved."""

    iteration: int = Field(description="iterations done (n)")
    iterations: int = Field(description="iterations the run's schedule asks for (N)")
    elapsed_s: float = Field(description="seconds since it was submitted (to its end, once "
                                         "it has ended)")
    seconds_per_iteration: float | None = Field(
        default=None, description="mean of its recent iterations (None before two are timed)")
    eta_s: float | None = Field(
        default=None, description="seconds left at that pace; None when not iterating")
    starved: RolloutStarvation | None = None
    timing: str = Field(description="elapsed and the estimate in words (what follows n of N)")
    summary: str = Field(description="the line the CLI shows: n of N, then the timing")


class ProposedCandidate(BaseModel):
    """A checkpoint the run proposed, and the promotion governance opened for it (if yet)."""

    checkpoint_id: str
    iteration: int | None = None
    proposed_at: datetime
    promotion_id: str | None = None
    promotion_status: str | None = None
    current_gate: str | None = None


@dataclass(frozen=True)
class TimedIteration:
    """One stored iteration: its number, when it was written, its batch's counts."""

    iteration: int
    at: datetime
    batch: Mapping[str, Any]


def duration(seconds: float) -> str:
    """``1 h 02 min``, ``3 min 05 s``, ``42 s``: short and exact enough to plan by."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _lost_episodes(last: TimedIteration) -> RolloutStarvation | None:
    learnt = _int(last.batch.get("trajectories"))
    failed, cut = _int(last.batch.get("skipped")), _int(last.batch.get("truncated_excluded"))
    lost = failed + cut
    if lost == 0 or lost < STARVED_LOSS_SHARE * (learnt + lost):
        return None
    return RolloutStarvation(
        kind="lost_episodes", iteration=last.iteration,
        message=(f"rollouts starved: iteration {last.iteration} learnt from {learnt} of "
                 f"{learnt + lost} episodes ({failed} failed or never started, {cut} cut by "
                 "the clock); see its episodes, add execution workers, or raise "
                 "rollout.deadline_s"))


def _no_batch(waiting_s: float, deadline_s: float, pace: float | None,
              iteration: int) -> RolloutStarvation | None:
    if waiting_s <= deadline_s + (deadline_s if pace is None else pace):
        return None
    since = f"since iteration {iteration}" if iteration else "since the run was submitted"
    return RolloutStarvation(
        kind="no_batch", waiting_s=waiting_s,
        message=(f"rollouts starved: no iteration for {duration(waiting_s)} {since}, longer "
                 f"than a batch's budget (rollout.deadline_s = {duration(deadline_s)}); is an "
                 "execution worker running, and free?"))


def _pace(timed: Sequence[TimedIteration], created_at: datetime) -> float | None:
    """Mean seconds per iteration over the recent ones (the first counts from submission
    only when it is all there is: it also holds loading the model)."""
    if len(timed) >= 2:
        span = (timed[-1].at - timed[0].at).total_seconds()
        steps = timed[-1].iteration - timed[0].iteration
        return span / steps if steps > 0 and span >= 0 else None
    if len(timed) == 1 and timed[0].iteration > 0:
        return max(0.0, (timed[0].at - created_at).total_seconds()) / timed[0].iteration
    return None


def scheduled_iterations(config: Mapping[str, Any]) -> int:
    """N of "iteration n of N": the stored config's ``schedule.iterations``."""
    return _int((config.get("schedule") or {}).get("iterations")) or _DEFAULT_ITERATIONS


def run_progress(
    *, status: str, iterations_done: int, config: Mapping[str, Any], created_at: datetime,
    updated_at: datetime | None, timed: Sequence[TimedIteration], now: datetime,
) -> RunProgress:
    """The run's progress at ``now`` from its row and its latest iterations (oldest first)."""
    total = scheduled_iterations(config)
    rollout = config.get("rollout") or {}
    deadline = rollout.get("deadline_s")
    deadline_s = float(deadline) if isinstance(deadline, int | float) else _DEFAULT_DEADLINE_S
    finished = status in FINISHED_RUN_STATUSES
    end = (updated_at or now) if finished else now
    elapsed = max(0.0, (end - created_at).total_seconds())
    pace = _pace(timed, created_at)
    iterating = status in _ITERATING
    eta = pace * max(0, total - iterations_done) if iterating and pace is not None else None
    starved = None
    if iterating:
        last_at = timed[-1].at if timed else created_at
        starved = (_lost_episodes(timed[-1]) if timed else None) or _no_batch(
            max(0.0, (now - last_at).total_seconds()), deadline_s, pace, iterations_done)
    parts = [f"elapsed {duration(elapsed)}"]
    if eta is not None:
        parts.append(f"about {duration(eta)} left")
    elif status == RunStatus.paused:
        parts.append("paused: no estimate until it resumes")
    elif iterating:
        parts.append("estimate after the first iterations")
    timing = ", ".join(parts)
    return RunProgress(iteration=iterations_done, iterations=total, elapsed_s=elapsed,
                       seconds_per_iteration=pace, eta_s=eta, starved=starved, timing=timing,
                       summary=f"iteration {iterations_done} of {total}, {timing}")


def timed_iterations(*, session: Session, run_id: str) -> list[TimedIteration]:
    """The run's latest iterations (oldest first) with their times and batch counts."""
    rows = session.exec(
        select(TrainingStep.iteration, TrainingStep.created_at, TrainingStep.metrics)
        .where(TrainingStep.run_id == run_id)
        .order_by(col(TrainingStep.iteration).desc()).limit(TIMED_ITERATIONS))
    timed = []
    for iteration, at, metrics in rows:
        batch = (metrics or {}).get("batch")
        timed.append(TimedIteration(iteration, at, batch if isinstance(batch, Mapping) else {}))
    return list(reversed(timed))


def proposed_candidates(*, session: Session, run_id: str) -> list[ProposedCandidate]:
    """What the run proposed, oldest first, each with its promotion once governance opened it."""
    rows = session.exec(
        select(Proposal, Checkpoint.iteration, Promotion)
        .join(Checkpoint, col(Checkpoint.id) == col(Proposal.checkpoint_id))
        .outerjoin(Promotion, col(Promotion.proposal_id) == col(Proposal.id))
        .where(Proposal.run_id == run_id)
        .order_by(col(Proposal.created_at), col(Proposal.id)))
    return [ProposedCandidate(
        checkpoint_id=proposal.checkpoint_id, iteration=iteration,
        proposed_at=proposal.created_at,
        promotion_id=promotion.id if promotion else None,
        promotion_status=promotion.status if promotion else None,
        current_gate=promotion.current_gate if promotion else None,
    ) for proposal, iteration, promotion in rows]
