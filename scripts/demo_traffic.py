"""Production traffic for the demo: an operator's client posting episodes to the API.

Production episodes are the agent at work; the routing table decides which
checkpoint serves each one. The generator can switch task mix mid-run, which is
how the demo injects a regression: traffic shifts to tasks the new model fails.
"""

from __future__ import annotations

import random
import threading
import time

import httpx


class TrafficGenerator:
    """Posts a small batch of production episodes every ``period_s`` on a background thread."""

    def __init__(self, api: str, token: str, tasks: dict[str, int], *, period_s: float = 1.5,
                 episodes_per_batch: int = 6) -> None:
        self._client = httpx.Client(base_url=api, timeout=30.0,
                                    headers={"Authorization": f"Bearer {token}"})
        self._tasks = dict(tasks)
        self._period = period_s
        self._per_batch = episodes_per_batch
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._rng = random.Random(7)
        self._thread = threading.Thread(target=self._loop, name="demo-traffic", daemon=True)
        self.batches = 0
        self.throttled = 0  # 429s: the API bounds production batches in flight
        self.errors: list[str] = []

    def start(self) -> None:
        """Begin sending."""
        self._thread.start()

    def switch_tasks(self, tasks: dict[str, int]) -> None:
        """From now on, send episodes of these tasks (task id -> its seed)."""
        with self._lock:
            self._tasks = dict(tasks)

    def stop(self) -> None:
        """Stop sending and wait for the thread."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                tasks = list(self._tasks.items())
            chosen = [self._rng.choice(tasks) for _ in range(self._per_batch)]
            items = [{"task_id": task, "seed": seed, "group_size": 1} for task, seed in chosen]
            try:
                response = self._client.post("/api/episodes", json={
                    "items": items, "max_concurrency": 4, "deadline_s": 120})
                if response.status_code == 202:
                    self.batches += 1
                elif response.status_code == 429:
                    # Backpressure: enough production batches run; send again when told.
                    self.throttled += 1
                    self._stop.wait(float(response.headers.get("Retry-After", self._period)))
                    continue
                else:
                    self.errors.append(f"{response.status_code}: {response.text[:200]}")
            except httpx.HTTPError as error:
                self.errors.append(str(error))
            self._stop.wait(self._period)


def wait_for(predicate: object, *, timeout_s: float, every_s: float = 2.0,
             what: str = "condition") -> object:
    """Poll a callable until it returns something truthy; raise naming what never happened."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate() if callable(predicate) else None
        if value:
            return value
        time.sleep(every_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
