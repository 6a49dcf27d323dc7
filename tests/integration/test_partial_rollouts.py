"""Partial rollouts on a real run: a cut episode continues under the next policy version.

The tiny model on CPU, the real Temporal, PostgreSQL and OPA. The batch deadline of
iteration 2 is made to pass right after the first turn of one task's episodes: the
episode loop's clock is the one stand-in (no sleeping, no race: the clock says the
deadline has passed once a turn was taken). Iteration 3's batch, sampled with policy
version 1, continues them; their first turn keeps version 0. The group waits: iteration 2
trains without it, iteration 3 trains its finished episodes, never the cut rows.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from temporalio import activity
from temporalio.client import Client

from execution_loop import activities as execution_activities
from execution_loop.environments.frozen_lake import MOVES, _move, generate_map
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

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_learning_fixtures"]
# Each step's action tokens, sliced out of its trajectory's one token sequence (arrays
# are 1-based in SQL; the offsets are 0-based, end exclusive).
ACTIONS = ("SELECT s.index, s.policy_version, q.token_ids[s.action_start + 1:s.action_end]"
           " AS action_token_ids FROM step s JOIN trajectory_sequence q USING (trajectory_id)"
           " WHERE s.trajectory_id = :t")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, created locally (no download)."""
    import torch

    from learning_loop.tiny_model import create_tiny_model

    torch.set_num_threads(1)
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def safe_first_move_seed(start: int) -> int:
    """A frozen-lake seed whose first move can neither fall in a hole nor reach the goal:
    so the first turn never ends the episode, and the cut after it always happens."""
    seed = start
    while True:
        lake = generate_map(seed)
        ends = lake.holes | {lake.goal}
        if all(_move(lake, lake.start, m) not in ends for m in MOVES):
            return seed
        seed += 1


async def test_a_cut_episode_continues_under_the_next_version_and_trains_once_finished(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own_settings = queue_settings(settings)
    alice = make_user(owner_engine)
    cut_seed = safe_first_move_seed(1800)
    kept_task = make_builtin_task(owner_engine, "frozen_lake", 1799)
    cut_task = make_builtin_task(owner_engine, "frozen_lake", cut_seed)
    config = run_config(
        tiny_dir, [kept_task, cut_task],
        rollout={"group_size": 2, "groups_per_iteration": 2, "max_turns": 3},
        asynchrony={"partial_rollouts": True},
        # The continued episodes' first turns are two versions old at iteration 3.
        update={"stale_samples": "importance_correct"},
        # A KL term: every update runs, even when a batch's rewards do not vary, so the
        # off-policy guard always reports.
        objective={"kl_coef": 0.01},
        schedule={"iterations": 3, "propose_every": 3},
    )
    run_id = make_run(owner_engine, config, alice)

    real_run_episode = execution_activities.run_episode

    def deadline_after_first_turn(*args: Any, **kwargs: Any) -> Any:
        """Iteration 2's episodes of the cut task: the deadline passes after turn one."""
        batch_of_iteration_2 = f"{run_id}-2-" in activity.info().workflow_id
        if batch_of_iteration_2 and kwargs["task_seed"] == cut_seed and not kwargs["resume"]:
            played, on_step = [False], kwargs["on_step"]

            def step_taken(step: Any) -> None:
                played[0] = True
                on_step(step)

            deadline = kwargs["deadline"]
            kwargs["on_step"] = step_taken
            kwargs["clock"] = lambda: deadline + 1.0 if played[0] else deadline - 3600.0
        return real_run_episode(*args, **kwargs)

    monkeypatch.setattr(execution_activities, "run_episode", deadline_after_first_turn)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice)
        result: RunStatus = await asyncio.wait_for(handle.result(), 600)
    assert result.iterations_done == 3

    trajectories = rows(owner_engine, "SELECT id, batch_id, group_id, task_id, status,"
                        " failure_reason, policy_version, num_steps, outcome FROM trajectory"
                        " WHERE run_id = :r", r=run_id)
    cut = [t for t in trajectories if t["failure_reason"] == "deadline"]
    assert len(cut) == 2 and {t["task_id"] for t in cut} == {cut_task}
    assert all(t["num_steps"] == 1 and t["policy_version"] == 0 for t in cut)
    assert all(t["batch_id"].startswith(f"{run_id}-2-") for t in cut)
    (group,) = {t["group_id"] for t in cut}

    continued = [t for t in trajectories if t["outcome"].get("continues")]
    assert sorted(t["outcome"]["continues"] for t in continued) == sorted(t["id"] for t in cut)
    for trajectory in continued:
        # Same group and task, in iteration 3's batch, sampled with policy version 1;
        # finished (the horizon of 3 turns or the lake), not cut again.
        assert trajectory["batch_id"].startswith(f"{run_id}-3-")
        assert trajectory["group_id"] == group and trajectory["task_id"] == cut_task
        assert trajectory["policy_version"] == 1
        assert trajectory["status"] == "completed" or trajectory["failure_reason"] == "max_turns"
        steps = rows(owner_engine, ACTIONS + " ORDER BY s.index", t=trajectory["id"])
        (prior_step,) = rows(owner_engine, ACTIONS, t=trajectory["outcome"]["continues"])
        assert steps[0]["action_token_ids"] == prior_step["action_token_ids"]  # replayed
        assert [s["policy_version"] for s in steps] == [0] + [None] * (len(steps) - 1)
        versions = {trajectory["policy_version"] if s["policy_version"] is None
                    else s["policy_version"] for s in steps}
        assert versions == {0, 1} and len(steps) >= 2

    metrics = {r["iteration"]: r["metrics"] for r in rows(
        owner_engine, "SELECT iteration, metrics FROM training_step WHERE run_id = :r",
        r=run_id)}
    # Iteration 2: the cut group waited (its other episodes too): only the kept task's
    # group trained, and no cut row was read.
    assert metrics[2]["series"]["partial/held_groups"] == 1.0
    assert metrics[2]["batch"]["trajectories"] == 2
    assert metrics[2]["batch"]["truncated_excluded"] == 0
    # Iteration 3: its own two groups plus the waiting group's two finished continuations;
    # the two cut rows were read with their group and left out (never their partial
    # outcome). The continuations' version-0 turns are two versions old for policy 2,
    # and the off-policy guard corrected exactly those.
    series = metrics[3]["series"]
    assert series["partial/continued"] == 2.0 and series["partial/carried_groups"] == 1.0
    assert metrics[3]["batch"]["trajectories"] == 4 + 2
    assert metrics[3]["batch"]["truncated_excluded"] == 2
    off_policy = metrics[3]["update"]["off_policy"]
    assert off_policy["max_staleness_seen"] == 2 and off_policy["stale_corrected"] == 2
