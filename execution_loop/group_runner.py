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
- Liveness: the group heartbeats when its episodes take steps, but not while any running
  episode has been silent for the heartbeat timeout, so a stuck turn still times the
  attempt out as it timed out its own activity.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass, field

from sqlalchemy import Engine
from temporalio import activity
from temporalio.exceptions import CancelledError

from execution_loop.activities import (
    HEARTBEAT_MIN_INTERVAL_S,
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
)
from execution_loop.store import StepRow, TrajectoryRow, write_trajectories
from triloop.policy import Authorizer

# How often the waiting activity looks for a cancellation while its episodes play.
_CANCEL_POLL_S = 0.1


class GroupHeartbeat:
    """The group's heartbeat: total steps done, throttled, held back while an episode is stuck."""

    def __init__(self, timeout_s: float | None, clock: Callable[[], float] = time.monotonic):
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}  # running episode -> its last sign of life
        self._steps: dict[str, int] = {}
        self._last_beat = clock()

    def started(self, episode_id: str) -> None:
        """An episode began playing (in its thread)."""
        with self._lock:
            self._seen[episode_id] = self._clock()

    def finished(self, episode_id: str) -> None:
        """An episode ended: it no longer holds the heartbeat back."""
        with self._lock:
            self._seen.pop(episode_id, None)

    def due(self, episode_id: str, steps_done: int) -> int | None:
        """Record a step; the steps to report if a heartbeat is due now, else None."""
        now = self._clock()
        with self._lock:
            self._seen[episode_id] = now
            self._steps[episode_id] = steps_done
            if now - self._last_beat < HEARTBEAT_MIN_INTERVAL_S:
                return None
            if self._timeout_s is not None and any(
                    now - seen >= self._timeout_s for seen in self._seen.values()):
                return None  # one episode is stuck in a turn: let the attempt time out
            self._last_beat = now
            return sum(self._steps.values())

    def progress(self, episode_id: str) -> Callable[[int], None]:
        """The episode's ``on_progress``: stop when cancelled, heartbeat when due."""

        def report(steps_done: int) -> None:
            if activity.is_cancelled():
                raise CancelledError("episode cancelled: the batch deadline passed")
            total = self.due(episode_id, steps_done)
            if total is not None:
                activity.heartbeat(total)

        return report


@dataclass
class _Played:
    """What the group's episodes came to in this attempt."""

    finished: list[tuple[TrajectoryRow, list[StepRow]]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    infrastructure: list[BaseException] = field(default_factory=list)
    cancelled: bool = False


class EpisodeGroupRunner:
    """The group activity, on the rollout activities' dependencies and the episode threads."""

    def __init__(self, *, rollout: RolloutActivities, engine: Engine, authorizer: Authorizer,
                 episodes: Executor) -> None:
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
        beat = GroupHeartbeat(timeout.total_seconds() if timeout else None)
        played = self._play_all(
            [job for job in request.episodes if job.spec.episode_id not in summaries], beat)
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
        if played.cancelled:
            raise CancelledError("episode group cancelled: the batch deadline passed")
        if played.infrastructure:  # retried: the next attempt plays only what is unstored
            raise played.infrastructure[0]
        return EpisodeGroupResult(
            summaries=[summaries[e] for e in order if e in summaries],
            failed={e: failed[e] for e in order if e in failed and e not in summaries})

    def _play_all(self, jobs: list[EpisodeInput], beat: GroupHeartbeat) -> _Played:
        """Every job on the episode threads; waits for all, or stops waiting when cancelled."""
        played = _Played()
        pending: dict[Future[tuple[TrajectoryRow, list[StepRow]]], EpisodeInput] = {}
        for job in jobs:
            # Each episode thread runs in a copy of the activity's context (heartbeat,
            # cancellation and info work there as in the activity's own thread).
            context = contextvars.copy_context()
            pending[self._episodes.submit(context.run, self._play_one, job, beat)] = job
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
            if activity.is_cancelled():  # the batch is over: keep what finished, stop waiting
                played.cancelled = True
                break
        return played

    def _play_one(self, job: EpisodeInput, beat: GroupHeartbeat
                  ) -> tuple[TrajectoryRow, list[StepRow]]:
        episode_id = job.spec.episode_id
        beat.started(episode_id)
        try:
            return self._rollout.play(job, beat.progress(episode_id))
        finally:
            beat.finished(episode_id)


__all__ = ["EpisodeGroupRunner", "GroupHeartbeat"]
