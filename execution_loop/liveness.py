"""Liveness of episode activities: signs of life from progress, heartbeats from one pump.

A turn of a real model on a busy CPU can take longer than the heartbeat timeout, so an
activity is not judged by its finished turns. Each running episode shows signs of life:
- a step taken (its environment answered);
- a token decoded for its turn, reported by the in-process batching engine
  (``execution_loop.inference.progress``), and, while its turn waits for a micro-batch,
  the engine advancing other sequences (it is waiting its turn, not stuck);
- a checkpoint being loaded: alive throughout, as loading reports no progress of its own.

``heartbeat_pump`` heartbeats for the whole activity from a helper thread, throttled, with
a ``HeartbeatReport`` that names the least lively running episode's stage. It holds back
while any running episode has been silent for the heartbeat timeout, so a stuck turn (no
token, no step) still times the attempt out, and the last report that reached the server
says where it stopped. Episodes waiting for an episode slot are not running yet: an
activity queued on a busy worker keeps heartbeating, and its deadline bounds the wait.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.exceptions import CancelledError
from transformers import PreTrainedTokenizerBase

from execution_loop.contracts import HEARTBEAT_TIMEOUT, HeartbeatReport
from execution_loop.inference.base import Generation, PolicyClient
from execution_loop.inference.progress import watching_decode

__all__ = ["HEARTBEAT_TIMEOUT", "EpisodeLiveness", "WatchedPolicy", "heartbeat_pump"]

# The pump heartbeats unless its last beat is younger than this: an SDK heartbeat costs
# ~0.25 ms of the worker's event loop, and Temporal itself throttles what it sends to 0.8
# of the heartbeat timeout (it sends the latest details when that interval ends).
HEARTBEAT_MIN_INTERVAL_S = 0.1
CANCELLED = "episode stopped: its batch was cancelled, its deadline passed, or its group stalled"


def _activity_cancelled() -> bool:
    try:
        return activity.is_cancelled()
    except RuntimeError:
        # A thread outside the activity's context: the model gateway's server answering a
        # black-box agent. Its turns stop through stop(), which the heartbeat pump and the
        # group runner call when the activity is cancelled.
        return False


@dataclass
class _Running:
    stage: str
    seen: float  # the last sign of life (clock seconds)
    loading: int = 0  # > 0 while it loads a checkpoint: alive without reports


class EpisodeLiveness:
    """Signs of life of an activity's running episodes, what each does, and when to beat."""

    def __init__(self, timeout_s: float | None, clock: Callable[[], float] = time.monotonic):
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._steps: dict[str, int] = {}
        self._last_beat = clock()
        self._stopped = threading.Event()

    def stop(self) -> None:
        """The activity gave up on its episodes: each stops before its next turn."""
        self._stopped.set()

    def should_stop(self) -> bool:
        """Whether the episodes should stop: the activity gave up, or was cancelled."""
        return self._stopped.is_set() or _activity_cancelled()

    def started(self, episode_id: str) -> None:
        """An episode began playing (in its thread)."""
        with self._lock:
            self._running[episode_id] = _Running(f"starting episode {episode_id}", self._clock())

    def finished(self, episode_id: str) -> None:
        """An episode ended: it no longer holds the heartbeat back."""
        with self._lock:
            self._running.pop(episode_id, None)

    def alive(self, episode_id: str, stage: str | None = None) -> None:
        """A sign of life of a running episode, and what it does now (None: as before)."""
        with self._lock:
            running = self._running.get(episode_id)
            if running is None:
                return  # finished, or played outside this activity's watch
            running.seen = self._clock()
            if stage is not None:
                running.stage = stage

    def stepped(self, episode_id: str, steps_done: int) -> None:
        """The episode took a step (``steps_done`` so far)."""
        with self._lock:
            self._steps[episode_id] = steps_done
        self.alive(episode_id)

    @contextmanager
    def loading(self, episode_id: str, checkpoint_id: str) -> Iterator[None]:
        """The episode loads (or waits for another episode's load of) a checkpoint."""
        with self._lock:
            running = self._running.get(episode_id)
            if running is not None:
                running.loading += 1
                running.stage = f"loading checkpoint {checkpoint_id[:12]}"
        try:
            yield
        finally:
            with self._lock:
                if running is not None:
                    running.loading -= 1
                    running.seen = self._clock()  # loading ended with a sign of life

    def report(self) -> HeartbeatReport:
        """The steps done, and the stage of the running episode silent the longest."""
        now = self._clock()
        with self._lock:
            steps = sum(self._steps.values())
            silent = [(0.0 if r.loading else now - r.seen, r.stage)
                      for r in self._running.values()]
        if not silent:
            return HeartbeatReport(steps=steps)
        silent_s, stage = max(silent, key=lambda item: item[0])
        return HeartbeatReport(steps=steps, stage=stage, silent_s=round(silent_s, 3))

    def stalled(self) -> HeartbeatReport | None:
        """The report naming a running episode silent for the heartbeat timeout, if any."""
        report = self.report()
        if self._timeout_s is not None and report.silent_s >= self._timeout_s:
            return report
        return None

    def due(self) -> HeartbeatReport | None:
        """The report to heartbeat now, or None: too soon, or an episode is stuck."""
        report = self.report()
        now = self._clock()
        with self._lock:
            if now - self._last_beat < HEARTBEAT_MIN_INTERVAL_S:
                return None
            if self._timeout_s is not None and report.silent_s >= self._timeout_s:
                return None  # one episode is stuck: let the attempt time out
            self._last_beat = now
        return report


@contextmanager
def heartbeat_pump(liveness: EpisodeLiveness) -> Iterator[None]:
    """Heartbeat for the activity from a helper thread whenever ``liveness`` says so."""
    timeout = activity.info().heartbeat_timeout
    interval = max(HEARTBEAT_MIN_INTERVAL_S, timeout.total_seconds() / 10) if timeout else 10.0
    context = contextvars.copy_context()  # the activity's context, for the helper thread
    stop = threading.Event()

    def pump() -> None:
        while not stop.wait(interval):
            if context.run(activity.is_cancelled):
                liveness.stop()  # reaches turns played outside the activity's context too
            report = liveness.due()
            if report is not None:
                context.run(activity.heartbeat, report.steps, report)

    helper = threading.Thread(target=pump, name="heartbeat-pump", daemon=True)
    helper.start()
    try:
        yield
    finally:
        stop.set()
        helper.join()


class _TurnWatcher:
    """One turn's ``DecodeWatcher``: tokens and waiting become the episode's signs of life."""

    def __init__(self, policy: WatchedPolicy, turn: int) -> None:
        self._policy = policy
        self._turn = turn

    @property
    def owner(self) -> str:
        return self._policy.owner

    def decoded(self, tokens: int) -> None:
        episode = self._policy.episode_id
        self._policy.liveness.alive(
            episode, f"decoding turn {self._turn} of episode {episode} ({tokens} tokens so far)")

    def waiting(self, engine_advanced: bool) -> None:
        if self._policy.liveness.should_stop():
            raise CancelledError(CANCELLED)
        if engine_advanced:  # queued behind others' micro-batch: its turn comes
            self._policy.liveness.alive(self._policy.episode_id)


class WatchedPolicy:
    """The episode's policy client, its turns reporting their progress to its liveness."""

    def __init__(self, policy: PolicyClient, liveness: EpisodeLiveness, *, episode_id: str,
                 owner: str, turns_before: int = 0) -> None:
        self._policy = policy
        self.liveness = liveness
        self.episode_id = episode_id
        self.owner = owner  # the run (or batch): the batching engine shares by it
        self._turns = turns_before  # a continuation's replayed turns come first
        self.checkpoint_id = policy.checkpoint_id

    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The checkpoint's tokenizer."""
        return self._policy.tokenizer()

    def generate(self, prompt_token_ids: list[int], *, max_new_tokens: int,
                 temperature: float, seed: int | None,
                 stop_token_ids: Sequence[int] = (), **options: Any) -> Generation:
        """The policy's turn, with its progress reported as it decodes."""
        if self.liveness.should_stop():
            raise CancelledError(CANCELLED)
        self._turns += 1
        turn, episode = self._turns, self.episode_id
        self.liveness.alive(episode, f"waiting for the first token of turn {turn} of episode"
                                     f" {episode}")
        with watching_decode(_TurnWatcher(self, turn)):
            generation = self._policy.generate(
                prompt_token_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                seed=seed, stop_token_ids=stop_token_ids, **options)
        self.liveness.alive(episode, f"stepping the environment after turn {turn} of episode"
                                     f" {episode}")
        return generation
