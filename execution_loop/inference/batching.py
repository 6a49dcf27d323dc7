"""One batching engine per loaded checkpoint: concurrent episodes share padded micro-batches.

Episodes run in their own threads (one activity each) and ask for one turn at a time. The
engine's thread takes every request that is waiting, plus those that keep arriving within
``gather_wait_s`` of the previous one (at most ``GATHER_CAP`` waits), up to
``max_batch_size``, and decodes them together
(``batched_sampling.sample_batch``); requests that arrive meanwhile form the next
micro-batch. Each request keeps its own seed, stop ids and temperature, so what it gets back
(ids, behaviour logprobs, stop reason) is what it would get alone, to float rounding.

The straggler wait (``TRILOOP_BATCH_GATHER_MS``, 15 ms by default) is sized for a busy CPU:
the 32 episodes that a checkpoint's load releases at once reached the engine more than the
former 2 ms apart while the learner ran beside them, and every new checkpoint's first wave
split in two (1 + 31, 5 + 27), a whole second decode. A lone request waits one gap.

Sharing: requests wait in arrival order, each under its owner (a run or a batch, from the
caller's ``DecodeWatcher``). When more wait than one micro-batch holds, the micro-batch is
filled round-robin over the owners (``fair_pick``), so one run's 64 episodes cannot keep
another run's requests waiting batch after batch. A request's watcher hears of each token
it gets and, while it waits, whether the engine is advancing others: a request queued
behind a long micro-batch is waiting its turn, not stuck.

A closed engine (its checkpoint was evicted from the worker's cache) accepts no new work
into the thread; a request that still arrives, from an episode already holding the client,
is decoded as a batch of one in the caller's thread, so the episode finishes instead of
failing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import torch

from execution_loop.inference.base import InferenceError
from execution_loop.inference.batched_sampling import Sample, SampleRequest
from execution_loop.inference.progress import DecodeWatcher, current_watcher

GATHER_CAP = 10  # the longest a micro-batch waits to form, in gather_wait_s
# How often a waiting request tells its watcher it still waits (seconds).
QUEUED_POLL_S = 0.1
BatchSampler = Callable[[Sequence[SampleRequest]], None]
"""Decodes a micro-batch in place (``sample_batch`` bound to one model)."""


@dataclass(frozen=True)
class EngineStats:
    """What the engine has done: how many micro-batches, of how many requests."""

    batches: int
    requests: int
    largest_batch: int


@dataclass
class _Pending:
    request: SampleRequest
    future: Future[Sample]
    owner: str = ""
    taken: bool = False  # in a micro-batch: no longer withdrawable


def fair_pick(owners: Sequence[str], capacity: int) -> list[int]:
    """Positions of the waiting requests (by owner, oldest first) a micro-batch takes (pure).

    All of them if they fit; else round-robin over the owners in order of their oldest
    request, each owner's requests in arrival order, until ``capacity`` are taken.
    """
    if len(owners) <= capacity:
        return list(range(len(owners)))
    queues: dict[str, deque[int]] = {}
    for position, owner in enumerate(owners):
        queues.setdefault(owner, deque()).append(position)
    picked: list[int] = []
    while len(picked) < capacity:
        for waiting in queues.values():
            if waiting and len(picked) < capacity:
                picked.append(waiting.popleft())
    return sorted(picked)


class BatchingEngine:
    """A thread that decodes waiting requests for one model in padded micro-batches."""

    def __init__(
        self,
        sampler: BatchSampler,
        *,
        name: str,
        max_batch_size: int = 64,
        gather_wait_s: float = 0.015,
        torch_threads: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if gather_wait_s < 0:
            raise ValueError(f"gather_wait_s must be >= 0 (seconds), got {gather_wait_s}")
        if torch_threads is not None and torch_threads < 1:
            raise ValueError(f"torch_threads must be at least 1, got {torch_threads}")
        self._sampler = sampler
        self.name = name
        self.max_batch_size = max_batch_size
        self.gather_wait_s = gather_wait_s
        self.torch_threads = torch_threads
        self._waiting: deque[_Pending] = deque()
        # Guards _waiting, _thread, _closed and the counters; wakes the engine's thread.
        self._state = threading.Condition()
        self._alone = threading.Lock()  # serialises batches of one after close
        self._thread: threading.Thread | None = None
        self._closed = False
        self._batches = self._requests = self._largest = 0
        self._tokens = 0  # decoded so far, every request together: the engine's progress

    def sample(self, request: SampleRequest) -> Sample:
        """Decode ``request`` with whatever else is waiting; blocks until it is done."""
        watcher = current_watcher()
        pending: _Pending | None = None
        with self._state:
            if not self._closed:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name=f"batching-{self.name[:12]}", daemon=True)
                    self._thread.start()
                pending = _Pending(request, Future(), watcher.owner if watcher else "")
                if watcher is not None:
                    request.on_token = self._counted(watcher)
                self._waiting.append(pending)
                self._state.notify_all()
        if pending is None:
            if watcher is not None:
                request.on_token = watcher.decoded
            with self._alone:
                self._decode([request])
            return request.result()
        if watcher is None:
            return pending.future.result()
        return self._await(pending, watcher)

    def _counted(self, watcher: DecodeWatcher) -> Callable[[int], None]:
        def on_token(tokens: int) -> None:
            with self._state:
                self._tokens += 1
            watcher.decoded(tokens)

        return on_token

    def _await(self, pending: _Pending, watcher: DecodeWatcher) -> Sample:
        """The result, telling the watcher meanwhile whether the engine advances others."""
        seen = self.tokens_decoded()
        while True:
            try:
                return pending.future.result(timeout=QUEUED_POLL_S)
            except FutureTimeout:
                pass
            with self._state:
                taken, now = pending.taken, self._tokens
            if taken:
                continue  # decoding: its own tokens are its progress
            try:
                watcher.waiting(now != seen)
            except BaseException:
                self._withdraw(pending)
                raise
            seen = now

    def _withdraw(self, pending: _Pending) -> None:
        """Take a waiting request out of the queue (its episode stopped waiting for it)."""
        with self._state:
            if not pending.taken:
                self._waiting.remove(pending)
                pending.taken = True

    def tokens_decoded(self) -> int:
        """Tokens the engine decoded so far, for every request together."""
        with self._state:
            return self._tokens

    def stats(self) -> EngineStats:
        """Counters since the engine started."""
        with self._state:
            return EngineStats(self._batches, self._requests, self._largest)

    def close(self) -> None:
        """Finish what is queued, then stop the thread (later requests run alone)."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            with self._state:
                self._state.notify_all()
            thread.join()

    def _decode(self, requests: Sequence[SampleRequest]) -> None:
        self._sampler(requests)
        with self._state:
            self._batches += 1
            self._requests += len(requests)
            self._largest = max(self._largest, len(requests))

    def _run(self) -> None:
        if self.torch_threads is not None:
            # Per calling thread (torch's OpenMP pool is per thread): this one decodes.
            torch.set_num_threads(self.torch_threads)
        while True:
            with self._state:
                while not self._waiting and not self._closed:
                    self._state.wait()
                if not self._waiting:
                    return  # closed, and everything queued was served
                batch = self._gather()
            self._serve(batch)

    def _gather(self) -> list[_Pending]:
        """The next micro-batch (under ``self._state``, with one request waiting at least).

        Everything already waiting joins; then the stragglers of the same wave (episodes
        whose environment step just ended) for as long as they keep coming within
        gather_wait_s of each other, up to GATHER_CAP waits in all: on a busy machine a
        wave arrives spread out, and splitting it doubles its decode time.
        """
        cap = time.monotonic() + GATHER_CAP * self.gather_wait_s
        while len(self._waiting) < self.max_batch_size and not self._closed:
            before = len(self._waiting)
            wait = min(self.gather_wait_s, cap - time.monotonic())
            if wait <= 0:
                break
            self._state.wait(timeout=wait)
            if len(self._waiting) == before:
                break  # nobody came within the gap
        waiting = list(self._waiting)
        picked = [waiting[i] for i in fair_pick([p.owner for p in waiting],
                                                self.max_batch_size)]
        for pending in picked:
            self._waiting.remove(pending)
            pending.taken = True
        return picked

    def _serve(self, batch: list[_Pending]) -> None:
        try:
            self._decode([p.request for p in batch])
        except Exception as error:  # noqa: BLE001 - every waiter must hear about it
            failure = InferenceError(f"batched sampling on {self.name} failed: {error}")
            failure.__cause__ = error
            for pending in batch:
                pending.future.set_exception(failure)
            return
        for pending in batch:
            pending.future.set_result(pending.request.result())
