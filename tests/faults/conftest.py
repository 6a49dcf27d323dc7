"""Fixtures for the service-outage tests: dedicated, restartable services and a scripted policy.

The session services of ``tests/conftest.py`` are shared with every other test, so
they are never stopped here. A test that takes a service down gets its own
PostgreSQL, OPA or Temporal server, started through ``triloop.devstack`` in the
test's temporary directory, stopped by the pid it recorded and started again on
the same data (data directory, sqlite file) and the same port.

Episodes are played by ``ScriptedPolicy``: every turn it answers a word that is not
a move, after a fixed delay, so every FrozenLake episode takes exactly
``max_turns`` (10) steps and a known time, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError

from execution_loop.inference.base import FINISH_STOP, Generation, PolicyClient
from execution_loop.serving import PolicyFactory
from tests.temporal_helpers import own_queues as shared_own_queues
from triloop.config import Settings
from triloop.devstack.postgres import provision_role_passwords, role_passwords, start_postgres
from triloop.devstack.processes import ServiceProcess, free_port, recorded_process
from triloop.devstack.servers import repo_root, start_opa, tool_path
from triloop.devstack.temporal_server import TemporalPorts, provision, start_temporal_server
from triloop.secrets import OWNER_PASSWORD, ensure_secret
from triloop.workflow_api import RolloutBatchResult

# FrozenLake's shipped contract: an episode of invalid moves lasts exactly this long.
MAX_TURNS = 10


@dataclass
class RestartableService:
    """A dedicated service: stop it by its recorded pid, start it again on the same state."""

    name: str
    address: str  # what clients are configured with: a URL or host:port
    launch: Callable[[], ServiceProcess]
    stop_signal: signal.Signals = signal.SIGTERM
    process: ServiceProcess | None = None
    stopped_at: float | None = None
    outages_s: list[float] = field(default_factory=list)  # stop signal -> ready again

    def start(self) -> None:
        """Start it (again) and wait until it answers."""
        self.process = self.launch()
        if self.stopped_at is not None:
            self.outages_s.append(time.monotonic() - self.stopped_at)
            self.stopped_at = None

    def stop(self, sig: signal.Signals | None = None) -> None:
        """Signal the recorded process and wait until it has exited."""
        assert self.process is not None, f"{self.name} was never started"
        running = recorded_process(self.process.pid_path)
        assert running is not None, f"{self.name} is not running (pid file {self.process.pid_path})"
        self.stopped_at = time.monotonic()
        running.send_signal(sig or self.stop_signal)
        running.wait(timeout=30)
        self.process.pid_path.unlink(missing_ok=True)

    def running(self) -> bool:
        """Whether the recorded process is alive."""
        return self.process is not None and recorded_process(self.process.pid_path) is not None

    async def astop(self, sig: signal.Signals | None = None) -> None:
        """``stop`` off the event loop, so an in-process worker keeps heartbeating meanwhile."""
        await asyncio.to_thread(self.stop, sig)

    async def astart(self) -> None:
        """``start`` off the event loop."""
        await asyncio.to_thread(self.start)


def _cleanup(service: RestartableService) -> None:
    if service.running():
        service.stop()


@pytest.fixture
def restartable_postgres(tmp_path: Path, stack_dir: Path) -> Iterator[RestartableService]:
    """A PostgreSQL cluster of this test's own, migrated to head; SIGINT = fast shutdown.

    ``address`` is its owner URL. Fast shutdown aborts open transactions and closes
    every connection at once (``pg_ctl stop -m fast``), as an operator's restart does.
    Durable like the dev stack and production (fsync, synchronous commit): the session
    cluster's ``durable=False`` acknowledges commits before their WAL is written, so a
    crash (immediate shutdown) loses trajectories the workflow was told were stored.
    """
    from triloop.db import engine_for_url
    from triloop.migrate import upgrade

    port = free_port()
    secrets_dir = stack_dir / "secrets"  # the session's credentials: the test plays every role
    password = ensure_secret(secrets_dir, OWNER_PASSWORD)
    url = Settings(home=stack_dir, pg_port=port).owner_url()
    service = RestartableService(
        "postgres", url,
        lambda: start_postgres(tmp_path / "pg", port=port, run_dir=tmp_path / "run",
                               log_dir=tmp_path / "logs", name="fault-postgres", durable=True,
                               owner_password=password),
        stop_signal=signal.SIGINT,
    )
    service.start()
    upgrade(url)
    provision_role_passwords(url, role_passwords(secrets_dir))
    yield service
    _cleanup(service)
    # The worker's and the test's pooled connections point at a server that is gone.
    owned = Settings(home=stack_dir, database_url=url)
    for engine_url in (url, owned.role_url("execution")):
        engine_for_url(engine_url).dispose()


@pytest.fixture
def restartable_opa(tmp_path: Path, stack_dir: Path) -> Iterator[RestartableService]:
    """An OPA server of this test's own on the project's policies; ``address`` is its URL."""
    port = free_port()
    service = RestartableService(
        "opa", f"http://127.0.0.1:{port}",
        lambda: start_opa(policies=repo_root() / "policies", port=port,
                          run_dir=tmp_path / "run", log_dir=tmp_path / "logs", name="fault-opa",
                          secrets_dir=stack_dir / "secrets"),
    )
    service.start()
    yield service
    _cleanup(service)


@pytest.fixture
def restartable_temporal(tmp_path: Path, stack_dir: Path) -> Iterator[RestartableService]:
    """A real Temporal server of this test's own (its SQLite file kept across restarts)."""
    ports = TemporalPorts.free()
    admin = Settings(home=stack_dir, temporal_address=f"127.0.0.1:{ports.frontend}")
    service = RestartableService(
        "temporal", admin.temporal_address,
        lambda: start_temporal_server(admin, state_dir=tmp_path / "temporal", ports=ports,
                                      run_dir=tmp_path / "run", log_dir=tmp_path / "logs",
                                      binary=tool_path("temporal-server"),
                                      name="fault-temporal"),
    )
    service.start()
    provision(admin)
    yield service
    _cleanup(service)


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's directory: the scripted policy uses its tokenizer only."""
    import torch

    from learning_loop.tiny_model import create_tiny_model

    torch.set_num_threads(1)
    return create_tiny_model(tmp_path_factory.mktemp("fault-tiny") / "model", seed=0)


class ScriptedPolicy:
    """Answers a word that is no move (FrozenLake counts a turn) after ``delay_s``."""

    def __init__(self, checkpoint_id: str, model_dir: Path, delay_s: float) -> None:
        from transformers import AutoTokenizer

        self.checkpoint_id = checkpoint_id
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._delay_s = delay_s
        self._ids = [*self._tokenizer.encode("ice", add_special_tokens=False),
                     self._tokenizer.eos_token_id]

    def tokenizer(self) -> Any:
        return self._tokenizer

    def generate(self, prompt_token_ids: list[int], *, max_new_tokens: int, temperature: float,
                 seed: int | None, stop_token_ids: Sequence[int] = ()) -> Generation:
        del prompt_token_ids, temperature, seed, stop_token_ids
        time.sleep(self._delay_s)
        ids = self._ids[:max_new_tokens]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), text="ice",
                          finish_reason=FINISH_STOP)


def scripted_policy(delay_s: float) -> PolicyFactory:
    """A ``policy_factory`` for ``build_worker`` whose turns take ``delay_s`` each."""

    def factory(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        return ScriptedPolicy(checkpoint_id, model_dir, delay_s)

    return factory


def own_queues(settings: Settings, **update: Any) -> Settings:
    """Settings with task queues of this test's own (and any other field replaced)."""
    return shared_own_queues(settings, "fault-", **update)


def trajectory_rows(engine: Engine, batch_id: str) -> list[dict[str, Any]]:
    """A batch's trajectories with their stored steps (count, lowest and highest index)."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT t.id, t.status, t.failure_reason, t.num_steps, "
            "(t.outcome->>'attempt')::int AS attempt, count(s.index) AS stored_steps, "
            "count(DISTINCT s.index) AS distinct_steps, min(s.index) AS first_index, "
            "max(s.index) AS last_index FROM trajectory t "
            "LEFT JOIN step s ON s.trajectory_id = t.id WHERE t.batch_id = :b GROUP BY t.id"),
            {"b": batch_id}).mappings().all()
    return [dict(r) for r in rows]


def stored_count(engine: Engine, batch_id: str) -> int:
    """Trajectories of the batch written so far."""
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM trajectory WHERE batch_id = :b"),
                                {"b": batch_id}).scalar_one())


def assert_each_episode_whole_and_once(
    rows: list[dict[str, Any]], expected_ids: list[str]
) -> None:
    """Every episode stored once, with all its steps (0..n-1) and played to its last turn."""
    ids = [r["id"] for r in rows]
    assert sorted(ids) == sorted(expected_ids), f"stored {sorted(ids)}"
    for row in rows:
        assert row["stored_steps"] == row["distinct_steps"] == row["num_steps"] == MAX_TURNS, row
        assert (row["first_index"], row["last_index"]) == (0, MAX_TURNS - 1), row
        # Played to its last turn: no batch deadline or lost attempt cut it short.
        assert (row["status"], row["failure_reason"]) == ("truncated", "max_turns"), row


async def wait_for_stored(engine: Engine, batch_id: str, at_least: int, timeout_s: float) -> int:
    """Poll until the batch has ``at_least`` trajectories; returns how many it has."""
    deadline = time.monotonic() + timeout_s
    while True:
        count = await asyncio.to_thread(stored_count, engine, batch_id)
        if count >= at_least:
            return count
        assert time.monotonic() < deadline, f"only {count} episodes stored in {timeout_s:.0f}s"
        await asyncio.sleep(0.1)


async def batch_result(
    handle: WorkflowHandle[Any, RolloutBatchResult], timeout_s: float
) -> RolloutBatchResult:
    """The workflow's result, asking again while the Temporal server is unreachable."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await asyncio.wait_for(handle.result(), max(1.0, deadline - time.monotonic()))
        except RPCError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
