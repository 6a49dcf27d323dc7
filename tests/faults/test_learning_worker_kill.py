"""SIGKILL the learning worker during an update; a restarted worker resumes the run.

The learning worker runs as its own process (``python -m learning_loop.worker``), as in
production; the execution worker and a governance stand-in run in the test process.
After the kill, Temporal notices the lost update by its heartbeat timeout and retries it
on the restarted worker, which resumes from the last stored checkpoint. The run must
finish with every iteration stored once, a gapless lineage, and each checkpoint's
optimizer having taken exactly one step per iteration (nothing applied twice).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle

from learning_loop.contracts import UPDATE_POLICY
from learning_loop.store import lineage
from tests.factories_learning import (
    frozen_lake_tasks,
    loops_running,
    make_run,
    make_user,
    queue_settings,
    rows,
    run_config,
    start_run,
)
from triloop.config import Settings
from triloop.devstack.servers import repo_root
from triloop.workflow_api import RunStatus

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_learning_fixtures"]
# Four, so that a kill that lands just after an update completed can aim at a later one.
ITERATIONS = 4


class WorkerProcess:
    """``python -m learning_loop.worker`` with the test's settings in its environment."""

    def __init__(self, settings: Settings, log: Path) -> None:
        self.env = {
            **os.environ,
            "TRILOOP_HOME": str(settings.home),
            "TRILOOP_DATABASE_URL": settings.owner_url(),
            "TRILOOP_SECRETS_DIR": str(settings.secrets),
            "TRILOOP_TEMPORAL_ADDRESS": settings.temporal_address,
            "TRILOOP_OPA_URL": settings.opa_url,
            "TRILOOP_ARTIFACT_DIR": str(settings.artifacts),
            "TRILOOP_TASK_QUEUE_PREFIX": settings.task_queue_prefix,
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "learning_loop.worker"], cwd=repo_root(), env=self.env,
                stdout=out, stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()


@pytest.fixture
def own_settings(settings: Settings) -> Settings:
    """Settings with this test's own task queues, shared with the worker subprocess."""
    return queue_settings(settings)


@pytest.fixture
def worker_process(own_settings: Settings, tmp_path: Path) -> Iterator[WorkerProcess]:
    """The learning worker as a subprocess (stopped at the end of the test)."""
    worker = WorkerProcess(own_settings, tmp_path / "learning-worker.log")
    yield worker
    worker.stop()


async def update_in_progress(handle: WorkflowHandle[object, object]) -> bool:
    """Whether an update activity has been picked up by a worker right now."""
    description = await handle.describe()
    return any(
        activity.activity_type.name == UPDATE_POLICY.name
        and activity.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
        for activity in description.raw_description.pending_activities
    )


async def test_killed_learning_worker_resumes_without_losing_or_repeating_iterations(
    client: Client, own_settings: Settings, owner_engine: Engine, tiny_dir: Path,
    worker_process: WorkerProcess,
) -> None:
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, [6, 7])
    # Every iteration's checkpoint is kept: the test reads each one's optimizer state.
    config = run_config(tiny_dir, tasks, schedule={"iterations": ITERATIONS,
                                                   "propose_every": ITERATIONS},
                        checkpoints={"keep_last": ITERATIONS + 1})
    run_id = make_run(owner_engine, config, alice)
    worker_process.start()
    async with loops_running(client, own_settings, learning=False):
        handle = await start_run(client, own_settings, run_id, config, alice,
                                 update_heartbeat_timeout_s=3.0)
        killed_during = await _kill_during_an_update(handle, owner_engine, run_id,
                                                     worker_process)
        worker_process.start()
        result: RunStatus = await asyncio.wait_for(handle.result(), 240)

    ended = "completed_with_alarms" if result.alarms_raised else "completed"
    assert (result.status, result.iterations_done) == (ended, ITERATIONS)
    steps = rows(owner_engine, "SELECT iteration, checkpoint_id FROM training_step "
                 "WHERE run_id = :r ORDER BY iteration", r=run_id)
    assert [s["iteration"] for s in steps] == list(range(1, ITERATIONS + 1))
    # Lineage without gaps: each iteration's checkpoint is the previous one's child, or the
    # previous one itself when the batch carried no learning signal (nothing to apply).
    chain = lineage(engine=owner_engine, checkpoint_id=result.latest_checkpoint_id or "")
    assert chain[0].parent_id is None and chain[0].id == result.base_checkpoint_id
    previous, expected_chain = chain[0].id, [chain[0].id]
    for step in steps:
        if step["checkpoint_id"] != previous:
            expected_chain.append(step["checkpoint_id"])
        previous = step["checkpoint_id"]
    assert [c.id for c in chain] == expected_chain
    for number, (parent, child) in enumerate(zip(chain, chain[1:], strict=False), start=1):
        assert child.parent_id == parent.id and child.run_id == run_id
        state = torch.load(Path(child.artifact_uri.removeprefix("file://")) / "trainer_state.pt",
                           map_location="cpu", weights_only=True)
        steps_taken = {int(s["step"]) for s in state["optimizer"]["state"].values()}
        assert steps_taken == {number}, "an update was applied twice or lost"
        assert state["data_cursor"]["iteration"] == child.iteration

    retried = await _update_attempts(handle)
    assert retried[killed_during] >= 2, f"the killed update was not retried: {retried}"
    run_row = rows(owner_engine, "SELECT status, iterations_done FROM training_run "
                   "WHERE id = :r", r=run_id)[0]
    assert (run_row["status"], run_row["iterations_done"]) == (ended, ITERATIONS)


async def _kill_during_an_update(
    handle: WorkflowHandle[object, object], engine: Engine, run_id: str, worker: WorkerProcess
) -> int:
    """SIGKILL the worker while an update after the first stored iteration runs; its number.

    A tiny model's update is short, so a kill aimed at one may land after it completed. The
    server still holds an update as started after the kill only when the kill cut it short;
    when it does not, the worker is restarted and the next update is aimed at.
    """
    deadline = asyncio.get_running_loop().time() + 180
    while asyncio.get_running_loop().time() < deadline:
        done = rows(engine, "SELECT count(*) AS n FROM training_step WHERE run_id = :r",
                    r=run_id)[0]["n"]
        if done >= 1 and await update_in_progress(handle):
            worker.kill()
            if await update_in_progress(handle):
                return await _updates_scheduled(handle)
            worker.start()
        await asyncio.sleep(0.05)
    raise AssertionError(f"no update of run {run_id} was cut short in time; see {worker.log}")


async def _updates_scheduled(handle: WorkflowHandle[object, object]) -> int:
    """How many update activities the run has scheduled so far (the last is the pending one)."""
    count = 0
    async for event in handle.fetch_history_events():
        if (event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and event.activity_task_scheduled_event_attributes.activity_type.name
                == UPDATE_POLICY.name):
            count += 1
    return count


async def _update_attempts(handle: WorkflowHandle[object, object]) -> dict[int, int]:
    """Attempt number of each update activity's final start, by its order (iteration)."""
    scheduled: dict[int, int] = {}
    attempts: dict[int, int] = {}
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == UPDATE_POLICY.name:
                scheduled[event.event_id] = len(scheduled) + 1
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            if started.scheduled_event_id in scheduled:
                attempts[scheduled[started.scheduled_event_id]] = started.attempt
    return attempts
