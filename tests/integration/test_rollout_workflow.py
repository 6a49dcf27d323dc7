"""RolloutWorkflow on the real Temporal, PostgreSQL and OPA, with the tiny model on CPU.

The worker runs in-process on a queue of its own per test; every assertion about
what was stored reads the database.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlmodel import Session
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Replayer

from execution_loop.activities import episode_seed
from execution_loop.contracts import RUN_EPISODE, RUN_EPISODE_GROUP
from execution_loop.episode import turn_seed
from execution_loop.inference.base import Generation, InferenceError, PolicyClient
from execution_loop.routing import canary_bucket
from execution_loop.store import load_turn_tokens
from execution_loop.worker import build_worker
from execution_loop.workflows import RolloutWorkflow
from tests.factories_execution import (
    StuckPolicy,
    make_builtin_task,
    make_task_on,
    register_builtin,
    register_checkpoint_dir,
    register_variant,
    request_batch,
    set_routing,
)
from triloop.config import Settings
from triloop.db import engine_for_url
from triloop.temporal import DATA_CONVERTER, connect
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    ROLLOUT_WORKFLOW,
    ContinuedEpisode,
    RolloutBatchInput,
    RolloutBatchResult,
    RolloutItem,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def checkpoint(owner_engine: Engine, tiny_dir: Path) -> str:
    """The tiny model registered as a checkpoint row."""
    return register_checkpoint_dir(owner_engine, tiny_dir)


@pytest.fixture
def queue_settings(settings: Settings) -> Settings:
    """The session's settings with a task queue of this test's own."""
    return settings.model_copy(
        update={"task_queue_prefix": f"{settings.task_queue_prefix}{uuid.uuid4().hex[:6]}-"}
    )


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    """A Temporal client for starting batches."""
    yield await connect(settings, identity="rollout-test", service="execution")


async def run_batch(client: Client, settings: Settings, batch: RolloutBatchInput,
                    **worker_kwargs: Any) -> RolloutBatchResult:
    """Run one batch with an in-process execution worker."""
    async with build_worker(client, settings, **worker_kwargs):
        return await client.execute_workflow(
            ROLLOUT_WORKFLOW, request_batch(engine_for_url(settings.owner_url()), batch),
            id=f"rollout-{batch.batch_id}",
            task_queue=settings.task_queue(EXECUTION_QUEUE), result_type=RolloutBatchResult,
        )


def stored(engine: Engine, batch_id: str) -> dict[str, dict[str, Any]]:
    """Trajectory rows of a batch with their step counts, keyed by id."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT t.*, (SELECT count(*) FROM step s WHERE s.trajectory_id = t.id) "
            "AS stored_steps FROM trajectory t WHERE t.batch_id = :b"), {"b": batch_id})
        found = rows.mappings().all()
    return {row["id"]: dict(row) for row in found}


def new_batch(purpose: str, items: list[RolloutItem], **kwargs: Any) -> RolloutBatchInput:
    """A batch with a fresh id."""
    return RolloutBatchInput(batch_id=f"b{uuid.uuid4().hex[:10]}", purpose=purpose,
                             items=items, **kwargs)


@pytest.mark.parametrize("environment", ["frozen_lake", "tool_arithmetic", "fix_ci_failure"])
async def test_batch_stores_every_episode_once_with_tokens(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str,
    environment: str,
) -> None:
    task = make_builtin_task(owner_engine, environment, seed=7)
    batch = new_batch("training", [RolloutItem(task, 7, group_size=2)], checkpoint_id=checkpoint,
                      run_id=None, policy_version=3, max_concurrency=2, deadline_s=240)
    result = await run_batch(client, queue_settings, batch)

    expected = [f"{batch.batch_id}:0:0", f"{batch.batch_id}:0:1"]
    rows = stored(owner_engine, batch.batch_id)
    assert sorted(rows) == sorted(result.trajectory_ids) == expected
    assert result.completed + result.truncated == 2 and result.failed == 0
    for row in rows.values():
        assert row["stored_steps"] == row["num_steps"] >= 1
        assert (row["checkpoint_id"], row["purpose"], row["policy_version"]) == (
            checkpoint, "training", 3)
        assert row["group_id"] == f"{batch.batch_id}:0"
    with Session(owner_engine) as session:  # sliced out of each episode's one sequence
        turns = [t for tid in expected for t in load_turn_tokens(session=session,
                                                                 trajectory_id=tid)]
    assert turns
    for turn in turns:
        assert turn.prompt_token_ids and turn.action_token_ids
        assert len(turn.behaviour_logprobs) == len(turn.action_token_ids)


async def test_a_batch_lowers_the_tokens_each_turn_may_generate(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str,
) -> None:
    # tool_arithmetic allows 256 tokens per turn; the batch (a run's rollout.max_new_tokens)
    # allows 2, and that is what the inference backend was asked for.
    task = make_builtin_task(owner_engine, "tool_arithmetic", seed=8)
    batch = new_batch("training", [RolloutItem(task, 8, group_size=2)], checkpoint_id=checkpoint,
                      max_concurrency=2, deadline_s=240, max_new_tokens=2)
    await run_batch(client, queue_settings, batch)
    with owner_engine.connect() as conn:
        lengths = conn.execute(text(
            "SELECT s.action_end - s.action_start FROM step s JOIN trajectory t"
            " ON t.id = s.trajectory_id WHERE t.batch_id = :b"), {"b": batch.batch_id}).scalars()
        per_turn = list(lengths)
    assert per_turn and max(per_turn) <= 2


async def test_deadline_records_unfinished_episodes_as_truncated(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str
) -> None:
    task = make_builtin_task(owner_engine, "tool_arithmetic", seed=11)
    batch = new_batch("training", [RolloutItem(task, 11, group_size=6)],
                      checkpoint_id=checkpoint, max_concurrency=1, deadline_s=1.0,
                      heartbeat_timeout_s=5)
    result = await run_batch(client, queue_settings, batch)

    rows = stored(owner_engine, batch.batch_id)
    assert len(rows) == 6 and sorted(result.trajectory_ids) == sorted(rows)
    assert result.truncated >= 4 and result.completed + result.truncated == 6
    never_started = [r for r in rows.values() if r["failure_reason"] == "batch_deadline"]
    assert never_started, "episodes queued behind the concurrency limit never ran"
    assert all(r["status"] == "truncated" and r["stored_steps"] == 0 for r in never_started)


async def test_policy_denial_writes_no_trajectory(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str
) -> None:
    dead_opa = queue_settings.model_copy(update={"opa_url": "http://127.0.0.1:9"})
    task = make_builtin_task(owner_engine, "frozen_lake", seed=5)
    batch = new_batch("training", [RolloutItem(task, 5, group_size=2)],
                      checkpoint_id=checkpoint, deadline_s=120)
    result = await run_batch(client, dead_opa, batch)

    assert result.failed == 2 and result.trajectory_ids == []
    assert stored(owner_engine, batch.batch_id) == {}
    with owner_engine.connect() as conn:
        denials = conn.execute(text(
            "SELECT count(*) FROM audit_event WHERE decision = 'deny' AND action = 'create' "
            "AND resource->>'id' LIKE :b"), {"b": f"{batch.batch_id}:%"}).scalar_one()
    assert denials == 1  # the group's two episodes are decided (and refused) together


async def test_batch_must_name_its_checkpoint_unless_production(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str
) -> None:
    task = make_builtin_task(owner_engine, "frozen_lake", seed=5)
    unnamed = new_batch("training", [RolloutItem(task, 5)])
    with pytest.raises(WorkflowFailureError) as unnamed_error:
        await run_batch(client, queue_settings, unnamed)
    assert "must name checkpoint_id" in str(unnamed_error.value.cause)

    chosen = new_batch("production", [RolloutItem(task, 5)], checkpoint_id=checkpoint)
    with pytest.raises(WorkflowFailureError) as chosen_error:
        await run_batch(client, queue_settings, chosen)
    assert "served by governance's routing" in str(chosen_error.value.cause)
    assert stored(owner_engine, unnamed.batch_id) == stored(owner_engine, chosen.batch_id) == {}



async def test_episodes_run_only_on_admitted_tasks(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str
) -> None:
    pending = make_task_on(owner_engine, register_builtin(owner_engine, "frozen_lake"), seed=401,
                           status="pending")
    batch = new_batch("training", [RolloutItem(pending, 401, group_size=2)],
                      checkpoint_id=checkpoint, deadline_s=120)
    result = await run_batch(client, queue_settings, batch)
    assert result.failed == 2 and result.trajectory_ids == []
    assert stored(owner_engine, batch.batch_id) == {}

@pytest.fixture
def routing(owner_engine: Engine) -> Iterator[None]:
    """Leave governance's routing table as it was found."""
    with owner_engine.connect() as conn:
        saved = conn.execute(text("SELECT slot, checkpoint_id, share FROM routing")).all()
    yield
    with owner_engine.begin() as conn:
        conn.execute(text("DELETE FROM routing"))
    for slot, checkpoint_id, share in saved:
        set_routing(owner_engine, slot, checkpoint_id, share)


@pytest.mark.usefixtures("routing")
async def test_production_routing_canary_share_and_shadow(
    client: Client, queue_settings: Settings, owner_engine: Engine, tiny_dir: Path,
    tmp_path: Path,
) -> None:
    production, canary, shadow = (register_variant(owner_engine, tiny_dir, tmp_path)
                                  for _ in "pcs")
    set_routing(owner_engine, "production", production)
    set_routing(owner_engine, "canary", canary, share=0.5)
    set_routing(owner_engine, "shadow", shadow)
    task = make_builtin_task(owner_engine, "frozen_lake", seed=9)
    batch = new_batch("production", [RolloutItem(task, 9, group_size=6)], max_concurrency=3,
                      deadline_s=240)
    while not 2 <= sum(canary_bucket(f"{batch.batch_id}:0:{i}") < 0.5 for i in range(6)) <= 4:
        batch.batch_id = f"b{uuid.uuid4().hex[:10]}"  # ids that exercise both arms
    result = await run_batch(client, queue_settings, batch)

    rows = stored(owner_engine, batch.batch_id)
    own = [f"{batch.batch_id}:0:{i}" for i in range(6)]
    served_by_canary = {e for e in own if canary_bucket(e) < 0.5}
    for episode in own:
        expected = ("canary", canary) if episode in served_by_canary else (
            "production", production)
        assert (rows[episode]["purpose"], rows[episode]["checkpoint_id"]) == expected
        assert result.checkpoints[episode] == expected[1]
    shadows = {k: v for k, v in rows.items() if v["purpose"] == "shadow"}
    assert sorted(shadows) == sorted(result.shadow_trajectory_ids) == sorted(
        f"{e}:shadow" for e in own if e not in served_by_canary)
    with owner_engine.connect() as conn:
        for shadow_id, row in shadows.items():
            production_id = shadow_id.removesuffix(":shadow")
            assert row["checkpoint_id"] == shadow and row["outcome"]["shadow_of"] == production_id
            # Same weights, seed and task: the shadow sees the same first situation, and
            # each recorded verdict matches the two stored actions. (Whether they are equal
            # is torch's business: two forwards on a loaded CPU may round differently.)
            shadow_steps = conn.execute(text(
                "SELECT action_text, feedback FROM step WHERE trajectory_id = :t ORDER BY index"),
                {"t": shadow_id}).all()
            played = conn.execute(text(
                "SELECT action_text FROM step WHERE trajectory_id = :t ORDER BY index"),
                {"t": production_id}).scalars().all()
            verdicts = [f["shadow_agreement"] for _, f in shadow_steps]
            assert verdicts[0]["compared"]
            for (action, _), verdict, production_action in zip(
                    shadow_steps, verdicts, played, strict=False):
                assert verdict["production_action"] == production_action
                if verdict["compared"]:
                    assert verdict["agreed"] == (action.strip() == production_action.strip())
            assert row["outcome"]["steps_compared"] == sum(v["compared"] for v in verdicts) >= 1
            assert row["outcome"]["steps_agreed"] == sum(v["agreed"] for v in verdicts)

    # The workflow is deterministic: its recorded history replays without divergence.
    history = await client.get_workflow_handle(f"rollout-{batch.batch_id}").fetch_history()
    replayer = Replayer(workflows=[RolloutWorkflow], data_converter=DATA_CONVERTER)
    await replayer.replay_workflow(history)


async def test_stuck_episodes_never_hold_the_batch_past_its_deadline(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str
) -> None:
    def stuck(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        return StuckPolicy(checkpoint_id, model_dir, delay_s=6.0)

    task = make_builtin_task(owner_engine, "frozen_lake", seed=6)
    batch = new_batch("training", [RolloutItem(task, 6, group_size=2)],
                      checkpoint_id=checkpoint, max_concurrency=2, deadline_s=1.0,
                      heartbeat_timeout_s=2)
    result = await run_batch(client, queue_settings, batch, policy_factory=stuck)

    assert result.truncated == 2 and result.completed == result.failed == 0
    rows = stored(owner_engine, batch.batch_id)
    assert sorted(rows) == sorted(result.trajectory_ids) and len(rows) == 2
    # Played to its end an episode takes 10 turns of 6 s; a turn without progress for the
    # heartbeat timeout (this stand-in reports no tokens) loses the group, which stops its
    # episodes after the turn in progress (counted, not timed, so load cannot change it).
    assert all(r["stored_steps"] <= 1 for r in rows.values()), rows
    assert {r["failure_reason"] for r in rows.values()} <= {
        "deadline", "batch_deadline", "heartbeat_timeout"}
    assert all(why.startswith(("heartbeat timeout while", "the batch deadline"))
               for why in result.lost.values()), result.lost


async def test_loading_a_checkpoint_slower_than_the_heartbeat_timeout_keeps_the_episode(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str
) -> None:
    def slow_to_load(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        time.sleep(5.0)  # a large checkpoint loading; the heartbeat timeout is 2 s
        return StuckPolicy(checkpoint_id, model_dir, delay_s=0.0)

    task = make_builtin_task(owner_engine, "frozen_lake", seed=8)
    batch = new_batch("training", [RolloutItem(task, 8)], checkpoint_id=checkpoint,
                      deadline_s=120, heartbeat_timeout_s=2)
    result = await run_batch(client, queue_settings, batch, policy_factory=slow_to_load)

    assert result.failed == 0 and len(result.trajectory_ids) == 1
    row = stored(owner_engine, batch.batch_id)[result.trajectory_ids[0]]
    assert row["outcome"]["attempt"] == 1 and row["stored_steps"] >= 1


def first_move_never_ends(start: int) -> int:
    """A frozen-lake seed whose first move can neither fall in a hole nor reach the goal."""
    from execution_loop.environments.frozen_lake import MOVES, _move, generate_map

    seed = start
    while True:
        lake = generate_map(seed)
        if all(_move(lake, lake.start, m) not in lake.holes | {lake.goal} for m in MOVES):
            return seed
        seed += 1


async def test_a_continuation_replays_a_cut_episode_of_its_own_run_only(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str,
) -> None:
    """Partial rollouts, execution side: the continuation resets with the seed, replays the
    stored turn, plays on and records each turn's version; another run cannot borrow it."""
    seed = first_move_never_ends(2200)
    task = make_builtin_task(owner_engine, "frozen_lake", seed=seed)
    run_a, run_b = f"run-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    first = new_batch("training", [RolloutItem(task, seed, group_size=1)],
                      checkpoint_id=checkpoint, run_id=run_a, policy_version=0,
                      max_concurrency=1, deadline_s=240, max_turns=1)
    await run_batch(client, queue_settings, first)
    cut_id = f"{first.batch_id}:0:0"
    assert stored(owner_engine, first.batch_id)[cut_id]["status"] == "truncated"
    episode = ContinuedEpisode(cut_id, task, seed, f"{first.batch_id}:0", 0)

    stranger = new_batch("training", [], checkpoint_id=checkpoint, run_id=run_b,
                         policy_version=1, max_concurrency=1, deadline_s=240, max_turns=3,
                         continue_episodes=[episode])
    refused = await run_batch(client, queue_settings, stranger)
    borrowed = f"{stranger.batch_id}:p0:0"
    assert refused.statuses == {borrowed: "failed"}
    assert stored(owner_engine, stranger.batch_id) == {}

    own = new_batch("training", [], checkpoint_id=checkpoint, run_id=run_a, policy_version=1,
                    max_concurrency=1, deadline_s=240, max_turns=3, continue_episodes=[episode])
    result = await run_batch(client, queue_settings, own)
    continued = f"{own.batch_id}:p0:0"
    assert result.statuses[continued] in ("completed", "truncated")
    row = stored(owner_engine, own.batch_id)[continued]
    assert row["group_id"] == f"{first.batch_id}:0" and row["policy_version"] == 1
    assert row["outcome"]["continues"] == cut_id and row["num_steps"] >= 2
    with owner_engine.connect() as conn:
        steps = conn.execute(text(
            "SELECT s.trajectory_id, s.index, s.policy_version, s.observation,"
            " q.token_ids[s.action_start + 1:s.action_end] AS action_token_ids"
            " FROM step s JOIN trajectory_sequence q USING (trajectory_id)"
            " WHERE s.trajectory_id = ANY(:ids) ORDER BY s.trajectory_id, s.index"),
            {"ids": [cut_id, continued]}).mappings().all()
    before = [s for s in steps if s["trajectory_id"] == cut_id]
    after = [s for s in steps if s["trajectory_id"] == continued]
    assert [s["policy_version"] for s in after] == [0] + [None] * (len(after) - 1)
    assert (after[0]["action_token_ids"], after[0]["observation"]) == (
        before[0]["action_token_ids"], before[0]["observation"])


# --- A group's episodes in one activity. Which episode fails is fixed by its id: an
# episode's sampling seeds come from its id (episode_seed), so a policy that refuses one
# first-turn seed fails exactly that episode.


def first_turn_seed(episode_id: str) -> int:
    """The sampling seed of an episode's first turn."""
    return turn_seed(episode_seed(episode_id), 0)


class RefusingPolicy(StuckPolicy):
    """Answers at once, but raises ``error`` on the first turn of chosen episodes.

    ``times``: how often each chosen episode is refused (1: a retry gets through).
    """

    def __init__(self, checkpoint_id: str, model_dir: Path, *, refused: set[int],
                 error: type[Exception], times: int | None = None) -> None:
        super().__init__(checkpoint_id, model_dir, delay_s=0.0)
        self._refused, self._error, self._times = refused, error, times
        self._count: dict[int, int] = {}
        self._lock = threading.Lock()

    def generate(self, prompt_token_ids: list[int], *, max_new_tokens: int, temperature: float,
                 seed: int | None, stop_token_ids: Sequence[int] = ()) -> Generation:
        if seed in self._refused:
            with self._lock:
                self._count[seed] = self._count.get(seed, 0) + 1
                refuse = self._times is None or self._count[seed] <= self._times
            if refuse:
                raise self._error(f"refused turn seed {seed}")
        return super().generate(prompt_token_ids, max_new_tokens=max_new_tokens,
                                temperature=temperature, seed=seed,
                                stop_token_ids=stop_token_ids)


def trajectory_decisions(engine: Engine, batch_id: str) -> list[dict[str, Any]]:
    """The audited ``create trajectory`` decisions of a batch, oldest first."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT decision, resource FROM audit_event WHERE action = 'create' AND "
            "resource->>'kind' = 'trajectory' AND resource->'attrs'->>'batch_id' = :b "
            "ORDER BY seq"), {"b": batch_id}).all()
    return [{"decision": decision, **resource} for decision, resource in rows]


async def scheduled_activities(client: Client, batch_id: str) -> list[str]:
    """The activity types the batch's workflow scheduled, in order."""
    history = await client.get_workflow_handle(f"rollout-{batch_id}").fetch_history()
    return [e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]


async def test_a_group_runs_as_one_activity_with_one_decision_and_isolated_failures(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str,
) -> None:
    task = make_builtin_task(owner_engine, "frozen_lake", seed=21)
    batch = new_batch("training", [RolloutItem(task, 21, group_size=4)],
                      checkpoint_id=checkpoint, max_concurrency=4, deadline_s=240)
    doomed = f"{batch.batch_id}:0:1"

    def factory(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        return RefusingPolicy(checkpoint_id, model_dir, refused={first_turn_seed(doomed)},
                              error=ValueError)

    result = await run_batch(client, queue_settings, batch, policy_factory=factory)

    others = [f"{batch.batch_id}:0:{i}" for i in (0, 2, 3)]
    rows = stored(owner_engine, batch.batch_id)
    assert sorted(rows) == sorted(result.trajectory_ids) == others
    assert result.statuses[doomed] == "failed" and result.failed == 1
    assert all(row["stored_steps"] == row["num_steps"] >= 1 for row in rows.values())
    # One activity for the group; one decision that names every episode it let in.
    assert await scheduled_activities(client, batch.batch_id) == [RUN_EPISODE_GROUP.name]
    decisions = trajectory_decisions(owner_engine, batch.batch_id)
    assert len(decisions) == 1 and decisions[0]["decision"] == "allow"
    assert decisions[0]["id"] == f"{batch.batch_id}:0"
    assert sorted(decisions[0]["attrs"]["trajectory_ids"]) == others


async def test_an_infrastructure_error_retries_only_the_unstored_episode(
    client: Client, queue_settings: Settings, owner_engine: Engine, checkpoint: str,
) -> None:
    task = make_builtin_task(owner_engine, "frozen_lake", seed=22)
    batch = new_batch("training", [RolloutItem(task, 22, group_size=3)],
                      checkpoint_id=checkpoint, max_concurrency=3, deadline_s=240)
    flaky = f"{batch.batch_id}:0:2"

    def factory(checkpoint_id: str, model_dir: Path) -> PolicyClient:
        return RefusingPolicy(checkpoint_id, model_dir, refused={first_turn_seed(flaky)},
                              error=InferenceError, times=1)

    result = await run_batch(client, queue_settings, batch, policy_factory=factory)

    rows = stored(owner_engine, batch.batch_id)
    assert sorted(rows) == sorted(result.trajectory_ids) == [
        f"{batch.batch_id}:0:{i}" for i in range(3)]
    assert result.failed == 0
    assert all(row["stored_steps"] == row["num_steps"] >= 1 for row in rows.values())
    # The first attempt stored the other two; the retry played the flaky one alone.
    assert {k: v["outcome"]["attempt"] for k, v in rows.items()} == {
        f"{batch.batch_id}:0:0": 1, f"{batch.batch_id}:0:1": 1, flaky: 2}
    decisions = trajectory_decisions(owner_engine, batch.batch_id)
    assert [d.get("attrs", {}).get("trajectory_ids") for d in decisions] == [
        [f"{batch.batch_id}:0:0", f"{batch.batch_id}:0:1"], None]
    assert decisions[1]["id"] == flaky  # a set of one is the lone episode's own decision
    activities = await scheduled_activities(client, batch.batch_id)
    assert RUN_EPISODE.name not in activities
