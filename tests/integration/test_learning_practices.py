"""A short real multi-task run with the issue-18 practices switched on.

Two built-in environments (frozen_lake and tool_arithmetic), the tiny model on CPU, the
real Temporal, PostgreSQL and OPA: each iteration stores reward and success rate per task
and per environment, the dynamic-sampling drop rate, and the rollouts obey the run's max_turns.
Template collapse is made to fire so the configured mitigation runs and is audited.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import ProgrammingError
from sqlmodel import Session
from temporalio.client import Client

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
from triloop.config import ServiceName, Settings
from triloop.wiring import build_authorizer
from triloop.workflow_api import RunStatus
from web.data.runs import run_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["tests.factories_learning_fixtures"]


async def test_a_multi_task_run_records_per_task_and_environment_reward_and_drop_rate(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path,
) -> None:
    own_settings = queue_settings(settings)
    alice = make_user(owner_engine)
    tasks = [make_builtin_task(owner_engine, "frozen_lake", 71),
             make_builtin_task(owner_engine, "tool_arithmetic", 72)]
    config = run_config(
        tiny_dir, tasks,
        rollout={"group_size": 3, "groups_per_iteration": 2, "max_turns": 1,
                 "max_new_tokens": 3},
        advantage={"credit": "discounted", "gamma": 0.9, "environment_normalization": True},
        sampling={"dynamic_sampling": True, "max_resample_rounds": 1,
                  "horizon_schedule": [{"from_iteration": 3, "max_turns": 2}]},
        # Thresholds that make template collapse fire on every iteration, to be mitigated.
        stability={"pause_on_alarm": False, "retrieval_margin": 1.0,
                   "collapse_min_entropy": 0.0, "min_discrimination_prompts": 2},
        mitigation={"on_alarm": "raise_entropy", "entropy_step": 0.01, "max_actions": 1},
        # Rollouts run two iterations ahead; the two-versions-old ones are corrected.
        asynchrony={"staleness_window": 2},
        update={"stale_samples": "importance_correct"},
        schedule={"iterations": 3, "propose_every": 3},
    )
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice)
        result: RunStatus = await asyncio.wait_for(handle.result(), 600)

    assert result.iterations_done == 3
    assert result.mitigations == ["iteration 1: raise_entropy"]  # one action: max_actions
    environments = {r["task"]: r["name"] for r in rows(
        owner_engine, "SELECT t.id AS task, v.environment_name AS name FROM task t JOIN"
        " environment_version v ON v.id = t.environment_version_id WHERE t.id = ANY(:t)",
        t=tasks)}
    assert sorted(environments.values()) == ["frozen_lake", "tool_arithmetic"]

    with Session(owner_engine) as session:
        metrics = run_metrics(session=session, run_id=run_id, after=None)
    assert metrics is not None and [p.iteration for p in metrics.metrics] == [1, 2, 3]
    for point in metrics.metrics:
        series = point.extra_metrics
        for task, name in environments.items():
            assert math.isfinite(series[f"reward/task/{task}"])
            assert f"reward/env/{name}" in series
        # Task success apart from reward (the environments' verdicts), overall and per key.
        assert 0.0 <= series["success/rate"] <= 1.0
        for task, name in environments.items():
            assert 0.0 <= series[f"success/task/{task}"] <= 1.0
            assert 0.0 <= series[f"success/env/{name}"] <= 1.0
        assert 0.0 <= series["dynamic_sampling/drop_rate"] <= 1.0
        assert series["dynamic_sampling/groups_dropped"] >= 0
        assert series["dynamic_sampling/resample_rounds"] in (0.0, 1.0)
    for point in metrics.metrics[1:]:
        assert point.extra_metrics["mitigation/entropy_coef_bonus"] == pytest.approx(0.01)

    # The run's max_turns, then the curriculum's, reached the episodes (the contracts
    # allow 10 and 4 turns).
    assert [p.extra_metrics["curriculum/max_turns"] for p in metrics.metrics] == [1.0, 1.0, 2.0]
    longest = {r["i"]: r["n"] for r in rows(
        owner_engine, "SELECT split_part(substr(batch_id, length(:r) + 2), '-', 1) AS i,"
        " max(num_steps) AS n FROM trajectory WHERE run_id = :r GROUP BY 1", r=run_id)}
    assert longest["1"] <= 1 and longest["2"] <= 1 and longest["3"] <= 2
    # rollout.max_new_tokens reached the inference backend (tool_arithmetic allows 256).
    generated = rows(owner_engine, "SELECT max((outcome->>'generated_tokens')::int"
                     " / greatest(num_steps, 1)) AS g FROM trajectory WHERE run_id = :r",
                     r=run_id)[0]
    assert 0 < generated["g"] <= 3
    lengths = rows(owner_engine, "SELECT count(DISTINCT batch_id) AS b"
                   " FROM trajectory WHERE run_id = :r", r=run_id)[0]
    rounds = sum(p.extra_metrics["dynamic_sampling/resample_rounds"] for p in metrics.metrics)
    assert lengths["b"] == 3 + rounds  # one batch per iteration plus each resampling round

    # Staleness window 2: iterations 2 and 3 were both sampled with the base (version 0)
    # while iteration 1 trained, so iteration 3 learned from data two versions old.
    versions = rows(owner_engine, "SELECT DISTINCT policy_version AS v FROM trajectory"
                    " WHERE run_id = :r AND batch_id LIKE :b", r=run_id, b=f"{run_id}-3-%")
    assert [v["v"] for v in versions] == [0]

    (event,) = rows(owner_engine, "SELECT actor, payload FROM audit_event WHERE action ="
                    " 'stability_mitigation' AND resource->>'id' = :r", r=run_id)
    assert event["actor"]["service"] == "learning"
    assert event["payload"]["kind"] == "raise_entropy" and event["payload"]["iteration"] == 1


def test_a_mitigation_is_audited_and_refused_without_the_policy(
    settings: Settings, owner_engine: Engine, role_engine: Callable[[ServiceName], Engine],
    tiny_dir: Path,
) -> None:
    from learning_loop.activities.run_state import RunActivities
    from learning_loop.contracts import MitigationInput

    alice = make_user(owner_engine)
    run_id = make_run(owner_engine, run_config(tiny_dir, ["t"]), alice)
    request = MitigationInput(run_id, 3, "rollback", ["iteration 3: echo trap"],
                              {"checkpoint_id": "c2"})
    learning = RunActivities(engine=role_engine("learning"),
                             authorizer=build_authorizer(settings, "learning"))
    assert learning.record_mitigation(request).recorded

    # A token bound to another service cannot speak for learning: OPA refuses, nothing
    # is recorded, and the workflow would fail rather than change training unrecorded.
    impostor = RunActivities(engine=role_engine("learning"),
                             authorizer=build_authorizer(settings, "execution"))
    # Its audit sink (execution's database role) may not even record the denial in
    # learning's name: the database refuses that row (issue 32, route 8).
    with pytest.raises(ProgrammingError, match="writes only its own service's events"):
        impostor.record_mitigation(MitigationInput(run_id, 4, "raise_entropy"))

    events = rows(owner_engine, "SELECT db_role, payload FROM audit_event WHERE action ="
                  " 'stability_mitigation' AND resource->>'id' = :r", r=run_id)
    assert [(e["db_role"], e["payload"]["iteration"], e["payload"]["kind"]) for e in events] == [
        ("triloop_learning", 3, "rollback")]
    assert events[0]["payload"]["detail"] == {"checkpoint_id": "c2"}


async def test_a_rollback_mitigation_continues_from_the_checkpoint_before_the_alarm(
    client: Client, settings: Settings, owner_engine: Engine, tiny_dir: Path,
) -> None:
    own_settings = queue_settings(settings)
    alice = make_user(owner_engine)
    tasks = [make_builtin_task(owner_engine, "frozen_lake", 73)]
    config = run_config(
        tiny_dir, tasks,
        rollout={"group_size": 3, "groups_per_iteration": 2, "max_turns": 2},
        # Thresholds that make template collapse fire on every iteration (no clock involved):
        # the first alarm rolls back, later ones only alarm (max_actions 1).
        stability={"pause_on_alarm": False, "retrieval_margin": 1.0,
                   "collapse_min_entropy": 0.0, "min_discrimination_prompts": 2},
        mitigation={"on_alarm": "rollback", "max_actions": 1},
        # Every update runs and moves the weights even when a batch's rewards do not vary:
        # iteration 1 always writes a checkpoint to roll back. The entropy bonus's gradient
        # depends on what was sampled, so iteration 2 (also from the base) cannot land on
        # c1's weights, which share its content address; weight decay and a KL term alone
        # made the same step from the same base twice.
        objective={"kl_coef": 0.01, "entropy_coef": 0.01}, optimizer={"weight_decay": 0.01},
        schedule={"iterations": 3, "propose_every": 3},
    )
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, own_settings):
        handle = await start_run(client, own_settings, run_id, config, alice)
        result: RunStatus = await asyncio.wait_for(handle.result(), 600)

    assert result.iterations_done == 3 and result.status == "completed_with_alarms"
    assert result.mitigations == ["iteration 1: rollback"]
    base = result.base_checkpoint_id
    checkpoints = {r["id"]: r for r in rows(
        owner_engine, "SELECT id, parent_id, iteration FROM checkpoint WHERE run_id = :r",
        r=run_id)}
    steps = {r["iteration"]: r["checkpoint_id"] for r in rows(
        owner_engine, "SELECT iteration, checkpoint_id FROM training_step WHERE run_id = :r",
        r=run_id)}

    def trained_from(iteration: int) -> str:
        """The checkpoint an update started from (an update without learning signal
        keeps its parent's id and writes no checkpoint row)."""
        row = checkpoints.get(steps[iteration])
        return str(row["parent_id"]) if row and row["iteration"] == iteration \
            else steps[iteration]

    alarmed = steps[1]
    assert alarmed != base and trained_from(1) == base
    # The run went on from the checkpoint before the alarm: iteration 2 trained from the
    # base, not from the alarmed c1, iteration 3 from iteration 2's, and no rollout after
    # the alarm sampled c1.
    assert trained_from(2) == base and trained_from(3) == steps[2]
    served = {r["c"] for r in rows(owner_engine, "SELECT DISTINCT checkpoint_id AS c FROM"
                                   " trajectory WHERE run_id = :r", r=run_id)}
    assert alarmed not in served

    # The action is an audited event on the run, recorded by the learning service.
    (event,) = rows(owner_engine, "SELECT actor, payload FROM audit_event WHERE action ="
                    " 'stability_mitigation' AND resource->>'id' = :r", r=run_id)
    assert event["actor"]["service"] == "learning"
    assert event["payload"]["kind"] == "rollback" and event["payload"]["iteration"] == 1
    assert event["payload"]["detail"] == {"checkpoint_id": base}
