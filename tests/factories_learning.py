"""What the learning-loop tests share: people, run rows, run configs, in-process workers.

Rows are inserted as the owner (set-up only), the way the web service would have written
them before starting a run. Workers run in-process on the test's own task queues: the
real learning workers, the real execution worker, and a stand-in for governance.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from tests.factories import insert, uid
from tests.factories_execution import make_builtin_task
from tests.learning_standins import StandInPromotionWorkflow
from tests.temporal_helpers import governance_nexus, loop_client, own_queues
from triloop.config import Settings
from triloop.run_config import run_config_from_data
from triloop.workflow_api import (
    GOVERNANCE_QUEUE,
    LEARNING_QUEUE,
    TRAINING_RUN_WORKFLOW,
    RunStatus,
    TrainingRunInput,
    training_run_workflow_id,
)


def make_user(engine: Engine, roles: Sequence[str] = ("ml_engineer",)) -> str:
    """A person with roles; returns the name."""
    name = uid("user-")
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO app_user (name, roles, created_by, disabled) "
            "VALUES (:n, :r, 'test', false)"),
            {"n": name, "r": list(roles)})
    return name


def frozen_lake_variant(engine: Engine, limits: dict[str, int] | None = None,
                        **initial_state: Any) -> str:
    """The shipped frozen_lake contract with ``initial_state`` overrides (e.g. ``layout=
    "corners"``) and ``limits`` overrides, registered as a version of frozen_lake; returns
    its id."""
    import yaml

    from execution_loop.environments.registry import CONTRACTS_DIR, builtin_contract_path
    from tests.factories_execution import register_contract

    data = yaml.safe_load(builtin_contract_path("frozen_lake").read_text(encoding="utf-8"))
    data["initial_state"] = {**data["initial_state"], **initial_state}
    data["limits"] = {**data["limits"], **(limits or {})}
    return register_contract(engine, yaml.safe_dump(data, sort_keys=False),
                             base_dir=CONTRACTS_DIR)


def frozen_lake_tasks(engine: Engine, seeds: Sequence[int], status: str = "admitted",
                      version: str | None = None) -> list[str]:
    """Tasks on the built-in frozen_lake contract (or on ``version``), one per seed."""
    from tests.factories_execution import make_task_on, register_builtin

    if version is not None:
        return [make_task_on(engine, version, seed, status) for seed in seeds]
    if status == "admitted":
        return [make_builtin_task(engine, "frozen_lake", seed) for seed in seeds]
    version = register_builtin(engine, "frozen_lake")
    return [make_task_on(engine, version, seed + 10_000 + uuid.uuid4().int % 10_000, status)
            for seed in seeds]


def run_config(base: Path | str, task_ids: Sequence[str], **sections: dict[str, Any]
               ) -> dict[str, Any]:
    """A small, fast run config on the tiny model; ``sections`` override section fields."""
    config: dict[str, Any] = {
        "name": "test run",
        "model": {"base": str(base)},
        "rollout": {"task_ids": list(task_ids), "group_size": 4, "groups_per_iteration": 2,
                    "temperature": 1.0, "deadline_s": 120},
        "optimizer": {"learning_rate": 1e-2},
        "update": {"micro_batch_size": 64},
        "stability": {"pause_on_alarm": False},
        "schedule": {"iterations": 2, "propose_every": 2, "seed": 0},
    }
    for name, fields in sections.items():
        config[name] = {**config.get(name, {}), **fields}
    return config


def make_run(engine: Engine, config: dict[str, Any], submitted_by: str) -> str:
    """A submitted ``training_run`` row, as the web service writes it; returns its id."""
    run_id = uid("run-")
    insert(engine, "training_run", id=run_id, name=config["name"], submitted_by=submitted_by,
           config=json.loads(json.dumps(config)), status="submitted", iterations_done=0,
           workflow_id=training_run_workflow_id(run_id))
    return run_id


def queue_settings(settings: Settings) -> Settings:
    """The session's settings with task queues (and Nexus endpoints) of the calling test's own."""
    return own_queues(settings)


@asynccontextmanager
async def loops_running(
    client: Client, settings: Settings, *, learning: bool = True,
    policy_factory: Any = None,
) -> AsyncIterator[None]:
    """Execution worker, governance stand-in and (unless told not to) the learning workers.

    Each runs in its own loop's namespace with that loop's token, as the workers do;
    ``client`` (the web service's stand-in, in learning's namespace) only starts and
    signals runs: the server lets the web token poll no task queue. Governance's stand-in
    answers through the real ``propose_candidate`` Nexus handler, which opens the stand-in
    promotion workflow. ``policy_factory``: the execution worker's policy (default: the
    configured backend).
    """
    from execution_loop.worker import build_worker as build_execution_worker
    from learning_loop.worker import build_worker as build_learning_workers

    execution = await loop_client(settings, "execution", "execution-test")
    governance = await loop_client(settings, "governance", "governance-stand-in")
    workers: list[Worker] = [
        build_execution_worker(execution, settings, max_concurrent_episodes=4,
                               policy_factory=policy_factory),
        Worker(governance, task_queue=settings.task_queue(GOVERNANCE_QUEUE),
               workflows=[StandInPromotionWorkflow],
               nexus_service_handlers=[governance_nexus(settings)]),
    ]
    if learning:
        own_learning = await loop_client(settings, "learning", "learning-test")
        workers += build_learning_workers(own_learning, settings)
    async with AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield


async def start_run(
    client: Client, settings: Settings, run_id: str, config: dict[str, Any], submitted_by: str,
    **carried: Any,
) -> WorkflowHandle[Any, Any]:
    """Start a run's workflow on the learning queue, as the web service does (config
    validated here, once, and carried typed)."""
    return await client.start_workflow(
        TRAINING_RUN_WORKFLOW,
        TrainingRunInput(run_id=run_id, submitted_by=submitted_by,
                         config=run_config_from_data(config), **carried),
        id=training_run_workflow_id(run_id), task_queue=settings.task_queue(LEARNING_QUEUE),
        result_type=RunStatus,
    )


def rows(engine: Engine, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Rows of a query as dicts (owner connection: the test's eyes only)."""
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(sql), params).mappings().all()]
