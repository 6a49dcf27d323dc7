"""Bring-your-own-environment tests share one path: register, admit, train briefly.

Everything on it is real: governance registers the contract (OPA asked, verifier hash
pinned), the AdmissionWorkflow runs the execution loop's real probe through Nexus and an
operator admits the task, then a TrainingRunWorkflow trains the tiny model on it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from tests.factories import make_person, record_decision
from tests.factories_learning import loops_running, make_run, make_user, run_config, start_run
from tests.temporal_helpers import loop_client, own_queues
from triloop.config import Settings
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    ADMISSION_DECIDE_UPDATE,
    ADMISSION_STATUS_QUERY,
    ADMISSION_WORKFLOW,
    GOVERNANCE_QUEUE,
    AdmissionInput,
    AdmissionResult,
    DecisionRef,
    RunStatus,
    admission_workflow_id,
)


def register(engine: Engine, settings: Settings, contract_path: Path, name: str) -> str:
    """Register a contract file as governance does; returns the version id."""
    from governance_loop.environments import document_from_file, register_environment_version

    document = document_from_file(contract_path, name=name)
    assert document.verifier_hash is not None, "registration pins the verifier"
    registered = register_environment_version(
        engine=engine, authorizer=build_authorizer(settings, "governance"), document=document,
        requested_by="gov-admin")
    return registered.id


async def admit(settings: Settings, owner: Engine, governance: Engine, web: Engine,
                version_id: str, seed: int) -> AdmissionResult:
    """A pending task on the version, probed for real and admitted by an operator."""
    from governance_loop.environments import add_task

    own = own_queues(settings, "byo-")
    task_id = add_task(engine=governance, authorizer=build_authorizer(own, "governance"),
                       version_ref=version_id, seed=seed, requested_by="gov-admin")
    return await admit_task(settings, owner, governance, web, task_id)


async def admit_task(settings: Settings, owner: Engine, governance: Engine, web: Engine,
                     task_id: str) -> AdmissionResult:
    """An existing pending task (one with an item, say), probed for real and admitted."""
    from execution_loop.worker import build_worker as build_execution_worker
    from governance_loop.worker import build_worker as build_governance_worker

    own = own_queues(settings, "byo-")
    client = await connect(own, identity="byo-test", service="governance")
    execution = await loop_client(own, "execution", "execution-byo")
    async with (build_governance_worker(client, own, engine=governance),
                build_execution_worker(execution, own, max_concurrent_episodes=2)):
        handle = await client.start_workflow(
            ADMISSION_WORKFLOW, AdmissionInput(task_id=task_id, requested_by="gov-admin"),
            id=admission_workflow_id(task_id), task_queue=own.task_queue(GOVERNANCE_QUEUE),
            result_type=AdmissionResult)
        for _ in range(600):
            status: AdmissionResult = await handle.query(ADMISSION_STATUS_QUERY,
                                                         result_type=AdmissionResult)
            if status.status != "assessing":
                break
            await asyncio.sleep(0.2)
        assert status.admissible, status.reasons
        make_person(owner, "byo-operator", ["operator"])
        decision = record_decision(web, kind="admission", subject=task_id, decision="approve",
                                   user="byo-operator", comment="evidence checked",
                                   owner=owner)
        await handle.execute_update(ADMISSION_DECIDE_UPDATE, DecisionRef(decision))
        result: AdmissionResult = await handle.result()
    return result


async def train_briefly(settings: Settings, owner: Engine, tiny_dir: Path, task_ids: list[str],
                        iterations: int = 2) -> tuple[str, RunStatus]:
    """A short training run on the tasks; returns the run id and its final status."""
    own = own_queues(settings, "byo-")
    client = await connect(own, identity="web-test", service="web", loop="learning")
    submitter = make_user(owner)
    config: dict[str, Any] = run_config(
        tiny_dir, task_ids, schedule={"iterations": iterations, "propose_every": iterations})
    run_id = make_run(owner, config, submitter)
    async with loops_running(client, own):
        handle = await start_run(client, own, run_id, config, submitter)
        status: RunStatus = await asyncio.wait_for(handle.result(), 300)
    return run_id, status
