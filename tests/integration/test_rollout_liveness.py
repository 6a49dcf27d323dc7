"""Liveness of rollout batches on the real Temporal, PostgreSQL and OPA: a slow model is
alive token by token, a stalled one is named, and a cancelled batch stops its episodes.

The policy is the real in-process torch backend on the tiny model (its batching engine
and progress reports included), with every forward (one decode step) slowed or stalled.
Assertions count attempts, turns and rows; none measures time.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError

from execution_loop.activities import episode_seed
from execution_loop.contracts import RUN_EPISODE_GROUP
from execution_loop.episode import turn_seed
from execution_loop.episode_slots import EpisodeSlots
from execution_loop.inference.base import Generation, PolicyClient
from execution_loop.inference.torch_backend import TorchPolicyClient
from execution_loop.worker import build_worker
from tests.factories_execution import make_builtin_task, register_checkpoint_dir, request_batch
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

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class SlowTokenPolicy(TorchPolicyClient):
    """The torch backend whose every decode step sleeps ``per_step_s``, and first waits for
    ``gate`` (a stalled engine until the test opens it); records each turn's seed.
    ``full_turns``: every turn decodes its whole token budget (EOS does not end it)."""

    def __init__(self, model_dir: Path, checkpoint_id: str, *, per_step_s: float = 0.0,
                 gate: threading.Event | None = None, full_turns: bool = False) -> None:
        super().__init__(model_dir, device="cpu", checkpoint_id=checkpoint_id)
        self.turn_seeds: list[int | None] = []
        self._full_turns = full_turns

        def slow_step(*_: Any) -> None:
            if gate is not None:
                gate.wait()
            time.sleep(per_step_s)

        self.model.register_forward_pre_hook(slow_step)

    def generate(self, prompt_token_ids: list[int], **kwargs: Any) -> Generation:
        self.turn_seeds.append(kwargs.get("seed"))
        return super().generate(prompt_token_ids, **kwargs)

    def sample(self, prompt_token_ids: Any, **kwargs: Any) -> Any:
        kwargs["ignore_eos"] = kwargs.get("ignore_eos", False) or self._full_turns
        return super().sample(prompt_token_ids, **kwargs)


@pytest.fixture(scope="module")
def checkpoint(owner_engine: Engine, tiny_dir: Path) -> str:
    return register_checkpoint_dir(owner_engine, tiny_dir)


@pytest.fixture
def queue_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"task_queue_prefix": f"{settings.task_queue_prefix}{uuid.uuid4().hex[:6]}-"})


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    yield await connect(settings, identity="liveness-test", service="execution")


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An engine stalled until the test (or its teardown) opens it."""
    event = threading.Event()
    yield event
    event.set()  # let the stalled threads finish


def new_batch(items: list[RolloutItem], **kwargs: Any) -> RolloutBatchInput:
    return RolloutBatchInput(batch_id=f"b{uuid.uuid4().hex[:10]}", purpose="training",
                             items=items, **kwargs)


async def start(client: Client, settings: Settings, batch: RolloutBatchInput) -> Any:
    return await client.start_workflow(
        ROLLOUT_WORKFLOW, request_batch(engine_for_url(settings.owner_url()), batch),
        id=f"rollout-{batch.batch_id}", task_queue=settings.task_queue(EXECUTION_QUEUE),
        result_type=RolloutBatchResult)


async def group_attempts(client: Client, batch_id: str) -> list[int]:
    """The attempt of each finished group activity, from the workflow history (an attempt
    that timed out and was retried leaves only its retry's start there)."""
    history = await client.get_workflow_handle(f"rollout-{batch_id}").fetch_history()
    groups = {e.event_id for e in history.events
              if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
              and e.activity_task_scheduled_event_attributes.activity_type.name
              == RUN_EPISODE_GROUP.name}
    return [e.activity_task_started_event_attributes.attempt for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            and e.activity_task_started_event_attributes.scheduled_event_id in groups]


async def failures(client: Client, batch_id: str) -> list[tuple[str, str]]:
    history = await client.get_workflow_handle(f"rollout-{batch_id}").fetch_history()
    return [(e.activity_task_failed_event_attributes.failure.application_failure_info.type,
             e.activity_task_failed_event_attributes.failure.message)
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]


def stored(engine: Engine, batch_id: str) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT t.id, t.status, t.failure_reason, (SELECT coalesce(sum(s.action_end - "
            "s.action_start), 0) FROM step s WHERE s.trajectory_id = t.id) AS tokens, (SELECT "
            "count(*) FROM step s WHERE s.trajectory_id = t.id) AS steps FROM trajectory t "
            "WHERE t.batch_id = :b"), {"b": batch_id}).mappings().all()
    return {row["id"]: dict(row) for row in rows}


async def test_a_turn_many_heartbeat_timeouts_long_finishes_without_a_retry(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str,
) -> None:
    """Each token is a sign of life: a turn of 41 decode steps of 0.25 s or more (over 10 s),
    with a heartbeat timeout of 3 s, is played once (before, only finished turns
    heartbeat: the attempt timed out in its first turn and was retried)."""
    task = make_builtin_task(owner_engine, "tool_arithmetic", seed=31)
    batch = new_batch([RolloutItem(task, 31, group_size=2)], checkpoint_id=checkpoint,
                      max_concurrency=2, deadline_s=300, heartbeat_timeout_s=3,
                      max_turns=1, max_new_tokens=40)

    def slow(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        return SlowTokenPolicy(model_dir, checkpoint_id, per_step_s=0.25, full_turns=True)

    async with build_worker(client, queue_settings, policy_factory=slow):
        result = await (await start(client, queue_settings, batch)).result()

    assert result.failed == 0 and result.lost == {}, result.lost
    assert result.completed + result.truncated == 2
    rows = stored(owner_engine, batch.batch_id)
    # Each turn decoded its 40 tokens: 41 slowed steps, over three heartbeat timeouts.
    assert len(rows) == 2 and all(r["steps"] == 1 and r["tokens"] == 40
                                  for r in rows.values()), rows
    assert await group_attempts(client, batch.batch_id) == [1]
    assert await failures(client, batch.batch_id) == []


async def test_a_stalled_engine_is_reported_as_a_heartbeat_timeout_naming_the_stage(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str,
    gate: threading.Event,
) -> None:
    task = make_builtin_task(owner_engine, "tool_arithmetic", seed=32)
    batch = new_batch([RolloutItem(task, 32, group_size=2)], checkpoint_id=checkpoint,
                      max_concurrency=2, deadline_s=300, heartbeat_timeout_s=2, max_turns=1)

    def stalled(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        return SlowTokenPolicy(model_dir, checkpoint_id, gate=gate)

    async with build_worker(client, queue_settings, policy_factory=stalled):
        result = await (await start(client, queue_settings, batch)).result()
        gate.set()

    episodes = [f"{batch.batch_id}:0:{i}" for i in range(2)]
    assert sorted(result.lost) == episodes
    for episode in episodes:
        assert result.lost[episode].startswith("heartbeat timeout while waiting for the first"
                                               " token of turn 1 of episode "), result.lost
        assert "no progress for 2 s" in result.lost[episode]
    rows = stored(owner_engine, batch.batch_id)
    assert {r["failure_reason"] for r in rows.values()} == {"heartbeat_timeout"}
    assert all(r["steps"] == 0 for r in rows.values())
    # The group failed once, on its first attempt, and was not retried.
    assert await group_attempts(client, batch.batch_id) == [1]
    ((kind, message),) = await failures(client, batch.batch_id)
    assert kind == "HeartbeatTimeout" and "turn 1 of episode" in message


async def wait_until(condition: Any, what: str) -> None:
    for _ in range(600):
        if condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


async def test_a_cancelled_batch_stops_its_episodes(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str,
    gate: threading.Event,
) -> None:
    """One episode slot, a group of three: the first episode's first turn is held in the
    engine while the batch is cancelled. Once the cancel reaches the activity, the queued
    episodes never start and the running one takes no further turn; nothing is stored."""
    task = make_builtin_task(owner_engine, "frozen_lake", seed=33)
    batch = new_batch([RolloutItem(task, 33, group_size=3)], checkpoint_id=checkpoint,
                      max_concurrency=3, deadline_s=300, heartbeat_timeout_s=60)
    slots = EpisodeSlots(1)
    policies: list[SlowTokenPolicy] = []

    def held(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        policies.append(SlowTokenPolicy(model_dir, checkpoint_id, gate=gate))
        return policies[0]

    async with build_worker(client, queue_settings, policy_factory=held, episode_slots=slots):
        handle = await start(client, queue_settings, batch)
        await wait_until(lambda: policies and policies[0].turn_seeds, "a first turn")
        assert sum(slots.waiting().values()) == 2
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        await wait_until(lambda: not slots.waiting(), "the queued episodes taken out")
        gate.set()  # the running turn ends: its episode must not take another
        await wait_until(lambda: not slots.held(), "every episode slot freed")

    first_turns = {turn_seed(episode_seed(f"{batch.batch_id}:0:{i}"), 0): i for i in range(3)}
    played = [first_turns.get(seed, "later turn") for seed in policies[0].turn_seeds]
    assert len(played) == 1 and played[0] in (0, 1, 2), played
    assert stored(owner_engine, batch.batch_id) == {}
    history = await handle.fetch_history()
    kinds = [EventType.Name(e.event_type) for e in history.events]
    assert "EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED" in kinds
    slots.shutdown()


async def test_a_run_whose_batch_lost_every_episode_fails_naming_the_cause(
    settings: Settings, owner_engine: Engine, tiny_dir: Path, gate: threading.Event,
) -> None:
    """RUN.yaml's rollout.heartbeat_timeout_s reaches the rollout; a stalled engine loses
    every episode, and the run's failure (its status_reason, what `train show` prints) is
    that heartbeat timeout and its stage, not the update's "no trainable data"."""
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

    own = queue_settings(settings)
    web = await connect(settings, identity="web-test", service="web", loop="learning")
    alice = make_user(owner_engine)
    tasks = frozen_lake_tasks(owner_engine, [4])
    config = run_config(tiny_dir, tasks, rollout={"groups_per_iteration": 1, "group_size": 2,
                                                  "heartbeat_timeout_s": 2})
    run_id = make_run(owner_engine, config, alice)

    def stalled(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        return SlowTokenPolicy(model_dir, checkpoint_id, gate=gate)

    async with loops_running(web, own, policy_factory=stalled):
        handle = await start_run(web, own, run_id, config, alice)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 300)
        gate.set()

    row = rows(owner_engine, "SELECT status, status_reason FROM training_run WHERE id = :r",
               r=run_id)[0]
    assert row["status"] == "failed"
    reason = row["status_reason"]
    assert "came back empty: all 2 episodes were lost" in reason, reason
    assert "heartbeat timeout while waiting for the first token of turn 1 of episode" in reason
    assert "no progress for 2 s" in reason and "NoTrainableData" not in reason
    assert "came back empty" in str(failure.value.cause)
