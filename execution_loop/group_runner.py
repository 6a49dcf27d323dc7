"""One activity per group of episodes: concurrent turns, one decision per set, one transaction.

Per episode, the one-activity-per-episode path paid a Temporal activity, an existence
query, an OPA decision with its audit event and a transaction of its own: on a small model
that is more than the episode itself (``bench/iteration.py``). A group's episodes run here
concurrently on the worker's episode threads, so the checkpoint's batching engine sees
their turns together; then ``write_trajectories`` authorizes each set of alike episodes
once (the decision lists every id) and stores them in one transaction.

What stays as it was, per episode:
- Ids are deterministic and the first write wins: an attempt first reports what earlier
  attempts stored, and plays only the rest.
- Every episode gets the batch deadline and stops at its next turn after it.
- An episode that fails on its own (its environment, a task not admitted, a policy
  denial) fails alone and stores nothing; the others are stored. An infrastructure error
  retries the activity after the finished episodes are stored (an episode that failed on
  its own in that attempt is played again by the retry).
- Liveness (``execution_loop.liveness``): the group heartbeats while its episodes make
  progress (steps, decoded tokens, checkpoint loading), but not while any running episode
  has been silent for the heartbeat timeout. Then the attempt ends itself: it stores what
  finished, stops the rest before their next turn, and fails, not to be retried, with a
  ``HeartbeatTimeout`` that names the stage the episode stuck in ("heartbeat timeout while
  decoding turn 3 of episode b:0:1 (12 tokens so far)"). A retry on the same worker would
  wait behind the same stuck turn. (A worker that dies stops heartbeating: Temporal's own
  heartbeat timeout retries the attempt elsewhere, as before.)

The episodes play on the worker's ``EpisodeSlots``, shared fairly between runs; when the
activity is cancelled (its batch's deadline, or its run cancelled), its queued episodes
never start and its running ones stop before their next turn.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

from sqlalchemy import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError

from execution_loop.activities import (
    RolloutActivities,
    episode_summary,
    is_infrastructure_error,
    non_retryable,
)
from execution_loop.contracts import (
    RUN_EPISODE_GROUP,
    EpisodeGroupInput,
    EpisodeGroupResult,
    EpisodeInput,
    HeartbeatReport,
)
from execution_loop.episode_slots import EpisodeSlots
from execution_loop.liveness import HEARTBEAT_TIMEOUT, EpisodeLiveness, heartbeat_pump
from execution_loop.store import StepRow, TrajectoryRow, write_trajectories
from triloop.policy import Authorizer

# How often the waiting activity looks for a cancellation while its episodes play.
_CANCEL_POLL_S = 0.1


@dataclass
class _Played:
    """What the group's episodes came to in this attempt."""

    finished: list[tuple[TrajectoryRow, list[StepRow]]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    infrastructure: list[BaseException] = field(default_factory=list)
    cancelled: bool = False
    stalled: HeartbeatReport | None = None  # an episode made no progress for the timeout


class EpisodeGroupRunner:
    """The group activity, on the rollout activities' dependencies and the episode threads."""

    def __init__(self, *, rollout: RolloutActivities, engine: Engine, authorizer: Authorizer,
                 episodes: EpisodeSlots) -> None:
        self._rollout = rollout
        self._engine = engine
        self._authorizer = authorizer
        self._episodes = episodes

    @activity.defn(name=RUN_EPISODE_GROUP.name, no_thread_cancel_exception=True)
    def run_group(self, request: EpisodeGroupInput) -> EpisodeGroupResult:
        """Play the group's unstored episodes together, store them once, report each."""
        order = [job.spec.episode_id for job in request.episodes]
        info = activity.info()
        # A retry reports what earlier attempts stored; a first attempt has nothing stored
        # (and should a row exist anyway, the insert keeps it: first write wins).
        summaries = self._rollout.stored_summaries(order) if info.attempt > 1 else {}
        timeout = info.heartbeat_timeout
        liveness = EpisodeLiveness(timeout.total_seconds() if timeout else None)
        with heartbeat_pump(liveness):
            played = self._play_all(
                [job for job in request.episodes if job.spec.episode_id not in summaries],
                liveness)
        failed = dict(played.failed)
        position = {episode_id: index for index, episode_id in enumerate(order)}
        played.finished.sort(key=lambda done: position[done[0].id])  # not finishing order
        try:
            stored = write_trajectories(  # the stored ones were just read: none is played
                engine=self._engine, authorizer=self._authorizer, episodes=played.finished,
                present={})
        except Exception as exc:
            if is_infrastructure_error(exc):
                raise
            raise non_retryable(exc) from exc
        for row, _ in played.finished:
            if row.id in stored.written:
                summaries[row.id] = episode_summary(row, written=True)
        summaries.update(self._rollout.stored_summaries(sorted(stored.present)))
        failed.update(stored.denied)
        if played.stalled is not None:
            raise stall_error(played.stalled, timeout.total_seconds() if timeout else 0.0)
        if played.cancelled:
            raise CancelledError("episode group cancelled: its batch was cancelled or its"
                                 " deadline passed")
        if played.infrastructure:  # retried: the next attempt plays only what is unstored
            raise played.infrastructure[0]
        return EpisodeGroupResult(
            summaries=[summaries[e] for e in order if e in summaries],
            failed={e: failed[e] for e in order if e in failed and e not in summaries})

    def _play_all(self, jobs: list[EpisodeInput], liveness: EpisodeLiveness) -> _Played:
        """Every job on the episode slots; waits for all, or stops waiting when cancelled."""
        played = _Played()
        pending: dict[Future[tuple[TrajectoryRow, list[StepRow]]], EpisodeInput] = {}
        for job in jobs:
            # Each episode thread runs in a copy of the activity's context (heartbeat,
            # cancellation and info work there as in the activity's own thread).
            context = contextvars.copy_context()
            owner = job.run_id or job.batch_id  # slots are shared fairly between runs
            pending[self._episodes.submit(owner, context.run, self._play_one, job,
                                          liveness)] = job
        while pending:
            done, _ = wait(pending, timeout=_CANCEL_POLL_S, return_when=FIRST_COMPLETED)
            for future in done:
                job = pending.pop(future)
                try:
                    played.finished.append(future.result())
                except CancelledError:
                    played.cancelled = True
                except Exception as exc:
                    if is_infrastructure_error(exc):
                        played.infrastructure.append(exc)
                    else:
                        played.failed[job.spec.episode_id] = f"{type(exc).__name__}: {exc}"
                        activity.logger.warning("episode %s failed: %s",
                                                job.spec.episode_id, exc)
            stalled = liveness.stalled() if pending else None
            if activity.is_cancelled() or stalled is not None:
                # The batch is over, or an episode is stuck: keep what finished, stop the
                # rest before their next turn, stop waiting.
                played.cancelled, played.stalled = stalled is None, stalled
                liveness.stop()
                for future in pending:
                    future.cancel()  # queued for a slot: never starts
                break
        return played

    def _play_one(self, job: EpisodeInput, liveness: EpisodeLiveness
                  ) -> tuple[TrajectoryRow, list[StepRow]]:
        episode_id = job.spec.episode_id
        liveness.started(episode_id)
        try:
            return self._rollout.play(job, liveness)
        finally:
            liveness.finished(episode_id)


def stall_error(report: HeartbeatReport, timeout_s: float) -> ApplicationError:
    """The group's failure when an episode made no progress for the heartbeat timeout."""
    return ApplicationError(
        f"heartbeat timeout while {report.stage}: no progress for {timeout_s:g} s"
        " (rollout.heartbeat_timeout_s; raise it for a model slower than that per token)",
        report, type=HEARTBEAT_TIMEOUT, non_retryable=True)


__all__ = ["EpisodeGroupRunner", "stall_error"]
