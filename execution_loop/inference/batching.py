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

A closed engine (its checkpoint was evicted from the worker's cache) accepts no new work
into the thread; a request that still arrives, from an episode already holding the client,
is decoded as a batch of one in the caller's thread, so the episode finishes instead of
failing.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from execution_loop.inference.base import InferenceError
from execution_loop.inference.batched_sampling import Sample, SampleRequest

GATHER_CAP = 10  # the longest a micro-batch waits to form, in gather_wait_s
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
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._state = threading.Lock()  # guards _thread, _closed and the counters
        self._alone = threading.Lock()  # serialises batches of one after close
        self._thread: threading.Thread | None = None
        self._closed = False
        self._batches = self._requests = self._largest = 0

    def sample(self, request: SampleRequest) -> Sample:
        """Decode ``request`` with whatever else is waiting; blocks until it is done."""
        pending: _Pending | None = None
        with self._state:
            if not self._closed:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name=f"batching-{self.name[:12]}", daemon=True)
                    self._thread.start()
                pending = _Pending(request, Future())
                self._queue.put(pending)
        if pending is None:
            with self._alone:
                self._decode([request])
            return request.result()
        return pending.future.result()

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
            self._queue.put(None)
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
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            # Everything already waiting joins; then the stragglers of the same wave
            # (episodes whose environment step just ended) for as long as they keep coming
            # within gather_wait_s of each other, up to GATHER_CAP waits in all: on a busy
            # machine a wave arrives spread out, and splitting it doubles its decode time.
            cap = time.monotonic() + GATHER_CAP * self.gather_wait_s
            while len(batch) < self.max_batch_size:
                wait = min(self.gather_wait_s, cap - time.monotonic())
                try:
                    item = self._queue.get(timeout=max(0.0, wait))
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._serve(batch)

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
