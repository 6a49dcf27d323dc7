"""PostgreSQL restarted in the middle of a rollout batch: the batch finishes, nothing half-written.

The execution worker runs in-process against a PostgreSQL cluster of the test's own
(the session's shared one is never touched). Once a few episodes are stored, the
server is stopped by its recorded pid (fast shutdown, or an immediate one that
leaves crash recovery to the next start) and kept down for a few seconds, at least
until an episode has failed to write and Temporal has scheduled its retry; then it
is started again on the same data directory and port. Each episode's trajectory and
steps go in one transaction, so an episode caught mid-write is absent, retried and
stored whole: every stored trajectory has exactly its ``num_steps`` steps, every
episode is stored once, and the audit chain has no gap.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from execution_loop.contracts import RUN_EPISODE_GROUP
from execution_loop.worker import build_worker
from tests.factories_execution import make_builtin_task, register_checkpoint_dir, request_batch
from tests.faults.conftest import (
    assert_each_episode_whole_and_once,
    batch_result,
    own_queues,
    scripted_policy,
    trajectory_rows,
    wait_for_stored,
)
from triloop.audit import verify_chain
from triloop.config import Settings
from triloop.db import engine_for_url
from triloop.temporal import connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
)

if TYPE_CHECKING:
    from tests.faults.conftest import RestartableService

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.timeout(120)]

EPISODES = 16
CONCURRENCY = 4  # the batch's max_concurrency: its one group runs as chunks of this many
TURN_DELAY_S = 0.1  # an episode: 10 turns, about 1 s
MIN_OUTAGE_S = 4.0  # long enough for episodes to finish, fail to write and back off
MAX_OUTAGE_S = 20.0


async def retried_episodes(handle: WorkflowHandle[object, object]) -> int:
    """Episode-group activities the server is retrying right now (attempt > 1)."""
    description = await handle.describe()
    return sum(1 for a in description.raw_description.pending_activities
               if a.activity_type.name == RUN_EPISODE_GROUP.name and a.attempt > 1)


@pytest.mark.parametrize("shutdown", [signal.SIGINT, signal.SIGQUIT], ids=["fast", "immediate"])
async def test_batch_survives_postgres_restart_without_half_written_trajectories(
    settings: Settings, restartable_postgres: RestartableService, scripted_model_dir: Path,
    shutdown: signal.Signals,
) -> None:
    pg = restartable_postgres
    owner = engine_for_url(pg.address)
    checkpoint = register_checkpoint_dir(owner, scripted_model_dir)
    task = make_builtin_task(owner, "frozen_lake", seed=3)
    test_settings = own_queues(settings, database_url=pg.address)
    batch = RolloutBatchInput(
        batch_id=f"pgr{uuid.uuid4().hex[:8]}", purpose="training", checkpoint_id=checkpoint,
        items=[RolloutItem(task, 3, group_size=EPISODES)], max_concurrency=CONCURRENCY,
        deadline_s=100,
        heartbeat_timeout_s=5,
    )
    client = await connect(test_settings, identity="fault-test", service="execution")
    async with build_worker(client, test_settings, policy_factory=scripted_policy(TURN_DELAY_S)):
        handle = await client.start_workflow(
            ROLLOUT_WORKFLOW, request_batch(owner, batch), id=f"rollout-{batch.batch_id}",
            task_queue=test_settings.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult)
        before = await wait_for_stored(owner, batch.batch_id, at_least=3, timeout_s=60)
        assert before < EPISODES, "the batch finished before the restart: nothing was tested"

        # SIGINT: fast shutdown (open transactions aborted); SIGQUIT: immediate shutdown,
        # no checkpoint, crash recovery on the next start.
        await pg.astop(shutdown)
        stopped = time.monotonic()
        await asyncio.sleep(MIN_OUTAGE_S)
        while (retrying := await retried_episodes(handle)) == 0:
            assert time.monotonic() < stopped + MAX_OUTAGE_S, (
                "no episode write failed while PostgreSQL was down")
            await asyncio.sleep(0.2)
        await pg.astart()
        result = await batch_result(handle, timeout_s=90)

    expected = [f"{batch.batch_id}:0:{i}" for i in range(EPISODES)]
    assert sorted(result.trajectory_ids) == sorted(expected)
    assert (result.failed, result.completed + result.truncated) == (0, EPISODES)
    rows = trajectory_rows(owner, batch.batch_id)
    assert_each_episode_whole_and_once(rows, expected)
    rewritten = [r["id"] for r in rows if r["attempt"] > 1]
    assert rewritten, "no episode was written by a retry after the restart"

    # Temporal scheduled each chunk of the group once; retries are attempts of that one
    # activity (a retried chunk plays only the episodes it had not stored).
    history = await handle.fetch_history()
    scheduled = [e for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                 and e.activity_task_scheduled_event_attributes.activity_type.name
                 == RUN_EPISODE_GROUP.name]
    assert len(scheduled) == EPISODES // CONCURRENCY
    final_attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                      if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    chain = verify_chain(owner)
    assert chain.ok, chain

    print(  # noqa: T201 - the numbers for the closing note (pytest -s)
        f"\n[postgres restart, {shutdown.name}] outage {pg.outages_s[0]:.1f}s; "
        f"{before}/{EPISODES} stored before it; {retrying} episode(s) in retry when it "
        f"returned; {sum(a > 1 for a in final_attempts)} completed by attempt > 1 "
        f"(max attempt {max(final_attempts)}), {len(rewritten)} written by a retry; "
        f"audit chain {chain.checked} rows ok"
    )
