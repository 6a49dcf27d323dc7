"""The execution worker's policy cache: one load per checkpoint, and a load holds up no one else."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from execution_loop.serving import PolicyCache
from learning_loop.tiny_model import create_tiny_model
from tests.factories_execution import register_checkpoint_dir
from triloop.config import ServiceName

# Only a failing test waits this long: a passing one never blocks on it.
HANG_S = 60.0


class _Client:
    def __init__(self, checkpoint_id: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_slow_load_holds_up_neither_loaded_checkpoints_nor_other_loads(
    owner_engine: Engine, role_engine: Callable[[ServiceName], Engine], tmp_path: Path,
) -> None:
    served, fresh, other = (
        register_checkpoint_dir(owner_engine, create_tiny_model(tmp_path / f"m{seed}", seed=seed))
        for seed in (7101, 7102, 7103))
    release = threading.Event()
    loads: list[str] = []

    def factory(checkpoint_id: str, _model_dir: Path) -> _Client:
        loads.append(checkpoint_id)
        if checkpoint_id == fresh:  # a large checkpoint, still loading
            release.wait(HANG_S)
        return _Client(checkpoint_id)

    cache = PolicyCache(engine=role_engine("execution"), factory=factory,  # type: ignore[arg-type]
                        home=tmp_path, capacity=2)
    production = cache.get(served)
    waiting: list[object] = []
    first = threading.Thread(target=lambda: waiting.append(cache.get(fresh)))
    second = threading.Thread(target=lambda: waiting.append(cache.get(fresh)))
    first.start()
    while fresh not in loads:  # the first episode of the new checkpoint is loading it
        threading.Event().wait(0.01)
    second.start()

    # Meanwhile the loaded checkpoint is served at once, and another one loads.
    assert cache.get(served) is production
    assert cache.get(other).checkpoint_id == other  # type: ignore[attr-defined]
    assert not waiting

    release.set()
    first.join(HANG_S)
    second.join(HANG_S)
    assert len(waiting) == 2 and waiting[0] is waiting[1]  # both episodes, one client
    assert loads.count(fresh) == 1
    # Capacity 2: the least recently used (the first checkpoint) was evicted and closed.
    assert cache.cached() == [other, fresh] and production.closed  # type: ignore[attr-defined]
