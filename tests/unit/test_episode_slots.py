"""Episode slots shared fairly between runs, and the engine's micro-batches shared by owner:
orders and counts (events, not clocks)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from execution_loop.episode_slots import EpisodeSlots, next_owner
from execution_loop.inference.batching import fair_pick


class Gate:
    """Jobs that record when they start and end only when released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._lock = threading.Lock()
        self._release: dict[str, threading.Event] = {}
        self._began: dict[str, threading.Event] = {}

    def job(self, name: str) -> Callable[[], str]:
        self._release[name] = threading.Event()
        self._began[name] = threading.Event()

        def run() -> str:
            with self._lock:
                self.started.append(name)
            self._began[name].set()
            assert self._release[name].wait(30), f"{name} never released"
            return name

        return run

    def release(self, name: str) -> None:
        self._release[name].set()

    def wait_started(self, name: str) -> None:
        assert self._began[name].wait(30), f"{name} never started"


def finish(gate: Gate, future: Future[str], name: str) -> None:
    gate.release(name)
    assert future.result(timeout=30) == name


def test_a_freed_slot_goes_to_the_owner_holding_fewest() -> None:
    assert next_owner({}, {}) is None
    assert next_owner({"a": 0, "b": 5}, {"a": 2, "b": 0}) == "b"  # holds fewer
    assert next_owner({"a": 0, "b": 5}, {"a": 1, "b": 1}) == "a"  # tie: waited longer


def test_a_second_batch_starts_before_the_first_one_finishes() -> None:
    """Batch a asks for 4 episodes on 2 slots, then batch b for 2: b's first episode takes
    the first slot a frees, before a's third episode (a plain pool would run all of a's)."""
    slots, gate = EpisodeSlots(2), Gate()
    a = [slots.submit("run-a", gate.job(f"a{i}")) for i in range(4)]
    gate.wait_started("a1")
    b = [slots.submit("run-b", gate.job(f"b{i}")) for i in range(2)]
    assert slots.held() == {"run-a": 2} and slots.waiting() == {"run-a": 2, "run-b": 2}
    finish(gate, a[0], "a0")
    gate.wait_started("b0")
    assert gate.started == ["a0", "a1", "b0"]
    assert slots.held() == {"run-a": 1, "run-b": 1}
    finish(gate, a[1], "a1")  # one each now: the tie goes to the longest waiting (a2)
    gate.wait_started("a2")
    finish(gate, b[0], "b0")
    gate.wait_started("b1")
    for name, future in [("a2", a[2]), ("b1", b[1])]:
        finish(gate, future, name)
    gate.wait_started("a3")
    finish(gate, a[3], "a3")
    assert gate.started == ["a0", "a1", "b0", "a2", "b1", "a3"]
    slots.shutdown()


def test_a_queued_episode_whose_activity_stopped_never_starts() -> None:
    slots, gate = EpisodeSlots(1), Gate()
    running = slots.submit("run-a", gate.job("a0"))
    gate.wait_started("a0")
    queued = slots.submit("run-a", gate.job("a1"))
    other = slots.submit("run-b", gate.job("b0"))
    assert queued.cancel()  # the activity was cancelled: take it out of the queue
    finish(gate, running, "a0")
    finish(gate, other, "b0")
    assert gate.started == ["a0", "b0"] and queued.cancelled()
    slots.shutdown()


def test_an_episode_that_raises_frees_its_slot() -> None:
    slots = EpisodeSlots(1)

    def broken() -> None:
        raise ValueError("environment broke")

    with pytest.raises(ValueError, match="environment broke"):
        slots.submit("run-a", broken).result(timeout=30)
    assert slots.submit("run-a", lambda: 7).result(timeout=30) == 7
    assert slots.held() == {}
    with pytest.raises(ValueError, match="at least 1"):
        EpisodeSlots(0)
    slots.shutdown()


def test_a_full_micro_batch_is_filled_round_robin_by_owner() -> None:
    # Run a's 5 requests came first, then b's 2: a batch of 4 takes two of each.
    owners = ["a", "a", "a", "a", "a", "b", "b"]
    assert fair_pick(owners, 4) == [0, 1, 5, 6]
    assert fair_pick(owners, 16) == list(range(7))  # everything fits: everything goes
    assert fair_pick(["a", "b", "a", "c"], 3) == [0, 1, 3]
