"""A short real run whose tasks carry tags: the curriculum by tag picks each iteration's
tasks, and every iteration stores reward and success per tag.

Three frozen_lake tasks tagged difficulty easy (two) and hard (one); the curriculum samples
only the easy ones at iteration 1 and the hard one from iteration 2. The tiny model on CPU,
the real Temporal, PostgreSQL and OPA. A curriculum that selects none of the plan's tasks
fails the run before any rollout, naming the stage.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlmodel import Session
from temporalio.client import Client, WorkflowFailureError

from tests.factories_execution import make_builtin_task
from tests.factories_learning import (
    loops_running,
    make_run,
    make_user,
    queue_settings,
    rows,
    run_config,
    start_run,
)
from triloop.config import Settings
from triloop.workflow_api import RunStatus
from web.data.runs import run_detail

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_learning_fixtures"]


def tag(engine: Engine, task_id: str, **tags: str) -> str:
    """Set a task's tags as registration would (owner connection: the test's hands)."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE task SET tags = CAST(:t AS jsonb) WHERE id = :i"),
                     {"t": json.dumps(tags), "i": task_id})
    return task_id


async def test_batches_follow_the_curriculum_and_series_are_kept_per_tag(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path,
) -> None:
    own_settings = queue_settings(settings)
    alice = make_user(owner_engine)
    easy = [tag(owner_engine, make_builtin_task(owner_engine, "frozen_lake", seed),
                difficulty="easy", domain="grid") for seed in (301, 302)]
    hard = tag(owner_engine, make_builtin_task(owner_engine, "frozen_lake", 303),
               difficulty="hard", domain="grid")
    config = run_config(
        tiny_dir, [hard, *easy],
        rollout={"group_size": 2, "groups_per_iteration": 2, "max_turns": 1,
                 "max_new_tokens": 3, "curriculum": [
                     {"from_iteration": 1, "tags": {"difficulty": ["easy"]}},
                     {"from_iteration": 2, "tags": {"difficulty": ["hard"]}}]},
        schedule={"iterations": 2, "propose_every": 2},
    )
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice)
        result: RunStatus = await asyncio.wait_for(handle.result(), 600)
    assert result.iterations_done == 2

    sampled = {r["i"]: set(r["tasks"]) for r in rows(
        owner_engine, "SELECT split_part(substr(batch_id, length(:r) + 2), '-', 1) AS i,"
        " array_agg(DISTINCT task_id) AS tasks FROM trajectory WHERE run_id = :r GROUP BY 1",
        r=run_id)}
    assert sampled == {"1": set(easy), "2": {hard}}

    with Session(owner_engine) as session:
        detail = run_detail(session=session, run_id=run_id)
    assert detail is not None
    first, second = (p.extra_metrics for p in detail.metrics)
    assert first["curriculum/stage"] == 1.0 and first["curriculum/tasks"] == 2.0
    assert second["curriculum/stage"] == 2.0 and second["curriculum/tasks"] == 1.0
    for series, present, absent in ((first, "easy", "hard"), (second, "hard", "easy")):
        assert 0.0 <= series[f"success/tag/difficulty={present}"] <= 1.0
        assert f"reward/tag/difficulty={present}" in series
        assert f"reward/tag/difficulty={absent}" not in series
        assert "reward/tag/domain=grid" in series
    # The API's per-tag rows: the latest iteration with episodes of each tag value.
    by_tag = {r.tag: r for r in detail.tags}
    assert by_tag["difficulty=easy"].iteration == 1
    assert by_tag["difficulty=hard"].iteration == 2
    assert by_tag["domain=grid"].iteration == 2
    assert by_tag["difficulty=hard"].success is not None


async def test_a_curriculum_stage_selecting_no_task_fails_the_run_before_rollouts(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path,
) -> None:
    own_settings = queue_settings(settings)
    alice = make_user(owner_engine)
    task = tag(owner_engine, make_builtin_task(owner_engine, "frozen_lake", 304),
               difficulty="easy")
    # Submitted past the web service's own check (which refuses this with a 422).
    config = run_config(tiny_dir, [task], rollout={
        "group_size": 2, "curriculum": [{"from_iteration": 2,
                                         "tags": {"difficulty": ["medium"]}}]})
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 300)
    assert "rollout.curriculum[0] (from iteration 2)" in str(failure.value.cause)
    assert "difficulty=medium" in str(failure.value.cause)
    (run,) = rows(owner_engine, "SELECT status, status_reason FROM training_run WHERE id = :r",
                  r=run_id)
    assert run["status"] == "failed" and "selects no task" in run["status_reason"]
    assert rows(owner_engine, "SELECT id FROM trajectory WHERE run_id = :r", r=run_id) == []
