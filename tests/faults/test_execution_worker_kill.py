"""An execution worker killed mid-batch: another finishes it, every episode stored once.

The worker runs as ``python -m execution_loop.worker`` (as in production), pointed at
the test services through ``TRILOOP_*``. It is SIGKILLed once some episodes are
stored; a second worker picks up the workflow and the lost activities (after their
heartbeat timeout) and the batch completes. The second worker then gets SIGTERM
and must exit cleanly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import WorkflowHandle

from tests.factories_execution import make_builtin_task, register_checkpoint_dir, request_batch
from triloop.config import Settings
from triloop.devstack.servers import repo_root
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
)

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.timeout(300)]

EPISODES = 12


async def playing(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether a worker has started an episode activity it has not finished."""
    description = await handle.describe()
    return any(a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
               for a in description.raw_description.pending_activities)


@pytest.fixture
def worker_env(settings: Settings, tmp_path: Path) -> dict[str, str]:
    """Environment of a worker process: the test services and a queue of this test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRILOOP_")}
    env.update({
        "TRILOOP_SERVICE": "execution",
        "TRILOOP_HOME": str(tmp_path),
        "TRILOOP_DATABASE_URL": settings.owner_url(),
        "TRILOOP_SECRETS_DIR": str(settings.secrets),
        "TRILOOP_TEMPORAL_ADDRESS": settings.temporal_address,
        "TRILOOP_OPA_URL": settings.opa_url,
        "TRILOOP_TASK_QUEUE_PREFIX": f"{settings.task_queue_prefix}kill-{uuid.uuid4().hex[:6]}-",
        "TRILOOP_INFERENCE_BACKEND": "torch",
        # Its metrics on a free port: never a stack's (a demo left running holds 9471).
        "TRILOOP_METRICS_PORT_EXECUTION": "0",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
    })
    return env


@pytest.fixture
def workers(worker_env: dict[str, str], tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started worker processes; any still alive at the end are killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``python -m execution_loop.worker`` with its output in ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "execution_loop.worker"], env=env,
                                cwd=repo_root(), stdout=out, stderr=subprocess.STDOUT)


def stored_count(engine: Engine, batch_id: str) -> int:
    """Trajectories of the batch written so far."""
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM trajectory WHERE batch_id = :b"),
                                {"b": batch_id}).scalar_one())


async def test_killed_worker_batch_finishes_with_each_episode_once(
    settings: Settings, owner_engine: Engine, worker_env: dict[str, str],
    workers: list[subprocess.Popen[bytes]], tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from learning_loop.tiny_model import create_tiny_model

    checkpoint = register_checkpoint_dir(
        owner_engine, create_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=1))
    task = make_builtin_task(owner_engine, "frozen_lake", seed=4)
    batch = RolloutBatchInput(
        batch_id=f"kill{uuid.uuid4().hex[:8]}", purpose="training", checkpoint_id=checkpoint,
        items=[RolloutItem(task, 4, group_size=EPISODES)], max_concurrency=2, deadline_s=240,
        heartbeat_timeout_s=3,
    )
    client = await connect(settings, identity="fault-test", service="execution")
    queue = worker_env["TRILOOP_TASK_QUEUE_PREFIX"] + EXECUTION_QUEUE
    handle = await client.start_workflow(
        ROLLOUT_WORKFLOW, request_batch(owner_engine, batch), id=f"rollout-{batch.batch_id}",
        task_queue=queue, result_type=RolloutBatchResult)
    log = tmp_path / "workers.log"
    workers.append(start_worker(worker_env, log))

    deadline = time.monotonic() + 120
    # Kill while an episode is being played (not between two), so one must be replayed.
    while stored_count(owner_engine, batch.batch_id) < 2 or not await playing(handle):
        assert workers[0].poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the first worker stored nothing in 120 s"
        await asyncio.sleep(0.05)
    workers[0].send_signal(signal.SIGKILL)
    workers[0].wait(timeout=10)
    assert stored_count(owner_engine, batch.batch_id) < EPISODES, "killed too late to matter"

    workers.append(start_worker(worker_env, log))
    result = await asyncio.wait_for(handle.result(), timeout=180)

    ids = [f"{batch.batch_id}:0:{i}" for i in range(EPISODES)]
    assert sorted(result.trajectory_ids) == sorted(ids) and result.failed == 0
    with owner_engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT t.id, t.num_steps, count(s.index), (t.outcome->>'attempt')::int "
            "FROM trajectory t LEFT JOIN step s ON s.trajectory_id = t.id "
            "WHERE t.batch_id = :b GROUP BY t.id"), {"b": batch.batch_id}).all()
    assert sorted(r[0] for r in rows) == sorted(ids)
    assert all(num_steps == steps for _, num_steps, steps, _ in rows)
    # The episodes the killed worker was playing were played again by the second one.
    assert any(attempt > 1 for *_, attempt in rows)

    workers[1].send_signal(signal.SIGTERM)
    assert workers[1].wait(timeout=60) == 0, log.read_text()[-3000:]
