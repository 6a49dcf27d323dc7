"""The Temporal server restarted while a rollout batch runs: the workflow continues and completes.

The test runs a Temporal dev server of its own (the session's is shared with other
tests) and the execution worker in-process. Once a few episodes are stored, the
server is stopped by its recorded pid and started again on the same sqlite file and
port. Episodes keep playing meanwhile (they are threads of the worker); their
heartbeats and completions fail until the server is back, and an episode whose
completion was lost is retried and finds its trajectory already stored. The same
worker and client reconnect by themselves; the workflow completes with every
episode recorded exactly once, and its history schedules each episode once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import Engine
from temporalio.api.enums.v1 import EventType, PendingActivityState
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
from triloop.config import Settings
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
OUTAGE_S = 3.0  # kept down this long: episodes finish and fail to report meanwhile


async def episodes_playing(handle: WorkflowHandle[object, object]) -> int:
    """Episodes a worker has started and not yet reported: the batch's one group runs as
    chunks of ``CONCURRENCY`` episodes, one activity each."""
    description = await handle.describe()
    return CONCURRENCY * sum(
        1 for a in description.raw_description.pending_activities
        if a.activity_type.name == RUN_EPISODE_GROUP.name
        and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED)


async def test_running_batch_survives_temporal_restart_with_each_episode_once(
    settings: Settings, owner_engine: Engine, restartable_temporal: RestartableService,
    scripted_model_dir: Path,
) -> None:
    temporal = restartable_temporal
    checkpoint = register_checkpoint_dir(owner_engine, scripted_model_dir)
    task = make_builtin_task(owner_engine, "frozen_lake", seed=21)
    test_settings = own_queues(settings, temporal_address=temporal.address)
    batch = RolloutBatchInput(
        batch_id=f"tmp{uuid.uuid4().hex[:8]}", purpose="training", checkpoint_id=checkpoint,
        items=[RolloutItem(task, 21, group_size=EPISODES)], max_concurrency=CONCURRENCY,
        deadline_s=100,
        heartbeat_timeout_s=5,
    )
    client = await connect(test_settings, identity="fault-test", service="execution")
    async with build_worker(client, test_settings, policy_factory=scripted_policy(TURN_DELAY_S)):
        handle = await client.start_workflow(
            ROLLOUT_WORKFLOW, request_batch(owner_engine, batch), id=f"rollout-{batch.batch_id}",
            task_queue=test_settings.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult)
        await wait_for_stored(owner_engine, batch.batch_id, at_least=3, timeout_s=60)
        # Stop while episodes are being played, so their completions are lost.
        deadline = time.monotonic() + 30
        while (playing := await episodes_playing(handle)) < 2:
            assert time.monotonic() < deadline, "no episodes in flight to catch"
            await asyncio.sleep(0.05)
        before = len(trajectory_rows(owner_engine, batch.batch_id))
        await temporal.astop()
        await asyncio.sleep(OUTAGE_S)
        during = len(trajectory_rows(owner_engine, batch.batch_id))
        await temporal.astart()
        result = await batch_result(handle, timeout_s=90)
    assert before < EPISODES, "the batch finished before the restart: nothing was tested"

    expected = [f"{batch.batch_id}:0:{i}" for i in range(EPISODES)]
    assert sorted(result.trajectory_ids) == sorted(expected)
    assert (result.failed, result.completed + result.truncated) == (0, EPISODES)
    rows = trajectory_rows(owner_engine, batch.batch_id)
    assert_each_episode_whole_and_once(rows, expected)

    history = await handle.fetch_history()
    episode_events = {
        kind: sum(1 for e in history.events if e.event_type == kind)
        for kind in (EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                     EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
    }
    scheduled = [e for e in history.events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert all(e.activity_task_scheduled_event_attributes.activity_type.name
               == RUN_EPISODE_GROUP.name for e in scheduled)
    chunks = EPISODES // CONCURRENCY
    assert list(episode_events.values()) == [chunks, chunks], episode_events
    # An attempt whose completion the server never got timed out and was retried; the
    # retry found the trajectory stored and reported it without writing it again.
    final_attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                      if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    rewritten = [r["id"] for r in rows if r["attempt"] > 1]

    print(  # noqa: T201 - the numbers for the closing note (pytest -s)
        f"\n[temporal restart] outage {temporal.outages_s[0]:.1f}s; {before}/{EPISODES} "
        f"stored before it, {playing} being played when it stopped, {during} stored by the "
        f"end of the outage; "
        f"{sum(a > 1 for a in final_attempts)} episode(s) completed by a retry "
        f"(max attempt {max(final_attempts)}), {len(rewritten)} of them written by it; "
        f"history: {EPISODES} episodes scheduled and completed once each, "
        f"{len(history.events)} events"
    )
