"""The worker's episode slots, shared fairly between the runs (or batches) that want them.

A worker plays at most ``capacity`` episodes at once (each on its own thread: torch and
subprocess sandboxes block). A plain thread pool hands slots out first come, first
served: a run whose batch arrived first with 32 episodes held all 16 slots until its
episodes were done, and a second run's group activity sat with none of its episodes
started. Here each owner (a run, or a batch without one) queues its own episodes, and a
freed slot goes to the waiting owner that holds the fewest slots (ties: whose oldest
episode has waited longest). An owner alone may use every slot; once others wait, slots
drift to an even share as episodes end. A queued episode whose activity is cancelled is
taken out (``Future.cancel``) and never starts.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["EpisodeSlots", "next_owner"]

T = TypeVar("T")


@dataclass
class _Queued:
    ticket: int  # arrival order, over every owner
    future: Future[Any]
    call: Callable[[], Any]


def next_owner(waiting: dict[str, int], held: dict[str, int]) -> str | None:
    """Who gets a freed slot (pure): the waiting owner holding fewest slots, oldest first.

    ``waiting``: owner -> ticket of its oldest queued episode; ``held``: owner -> slots.
    """
    if not waiting:
        return None
    return min(waiting, key=lambda owner: (held.get(owner, 0), waiting[owner]))


class EpisodeSlots:
    """``capacity`` episode threads, handed to owners fairly."""

    def __init__(self, capacity: int, *, thread_name_prefix: str = "group-episode") -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 episode slot, got {capacity}")
        self.capacity = capacity
        self._threads = ThreadPoolExecutor(max_workers=capacity,
                                           thread_name_prefix=thread_name_prefix)
        self._lock = threading.Lock()
        self._queues: dict[str, deque[_Queued]] = {}
        self._held: dict[str, int] = {}
        self._tickets = itertools.count()

    def submit(self, owner: str, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``fn(*args)`` for ``owner``; it runs when ``owner``'s turn for a slot comes."""
        future: Future[T] = Future()
        queued = _Queued(next(self._tickets), future, lambda: fn(*args))
        with self._lock:
            self._queues.setdefault(owner, deque()).append(queued)
        self._dispatch()
        return future

    def held(self) -> dict[str, int]:
        """Slots each owner holds now."""
        with self._lock:
            return {owner: n for owner, n in self._held.items() if n}

    def waiting(self) -> dict[str, int]:
        """Episodes each owner has queued, not yet started."""
        with self._lock:
            counts = {owner: sum(not q.future.cancelled() for q in queue)
                      for owner, queue in self._queues.items()}
        return {owner: count for owner, count in counts.items() if count}

    def shutdown(self) -> None:
        """Stop the threads once the running episodes end (queued ones never start)."""
        with self._lock:
            queued = [q for queue in self._queues.values() for q in queue]
            self._queues.clear()
        for item in queued:
            item.future.cancel()
        self._threads.shutdown(wait=False)

    def _dispatch(self) -> None:
        """Start queued episodes while slots are free, fairest owner first."""
        while True:
            with self._lock:
                picked = self._pick()
                if picked is None:
                    return
                owner, queued = picked
                self._held[owner] = self._held.get(owner, 0) + 1
            self._threads.submit(self._run, owner, queued)

    def _pick(self) -> tuple[str, _Queued] | None:
        """Under the lock: the next episode to start, if a slot is free."""
        if sum(self._held.values()) >= self.capacity:
            return None
        while True:
            for queue in self._queues.values():
                while queue and queue[0].future.cancelled():
                    queue.popleft()  # its activity stopped waiting for it
            oldest = {owner: queue[0].ticket for owner, queue in self._queues.items() if queue}
            owner = next_owner(oldest, self._held)
            if owner is None:
                return None
            queued = self._queues[owner].popleft()
            if queued.future.set_running_or_notify_cancel():
                return owner, queued

    def _run(self, owner: str, queued: _Queued) -> None:
        try:
            result = queued.call()
        except BaseException as error:  # noqa: BLE001 - the caller reads it from the future
            queued.future.set_exception(error)
        else:
            queued.future.set_result(result)
        finally:
            with self._lock:
                self._held[owner] -= 1
            self._dispatch()
