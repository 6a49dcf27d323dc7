"""A black-box agent through the model gateway: admission, then a short training run.

Real PostgreSQL, Temporal and OPA; the tiny model on CPU. The contract is the shipped
``tool_arithmetic_agent.yaml``: tool_arithmetic played by ``arithmetic_agent.py``, a
program that knows only an OpenAI-compatible base URL and its environment's URL.
Governance registers it, the real admission probe (unchanged: it probes the
environment, not the agent) gathers evidence, an operator admits the task, and the
learning loop trains on the episodes the agent played through the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session
from temporalio.client import Client

from execution_loop.environments.registry import CONTRACTS_DIR
from execution_loop.sandboxes import bubblewrap_problem
from execution_loop.store import load_turn_tokens
from governance_loop.durations import PromotionTiming
from governance_loop.environments import (
    add_task,
    document_from_file,
    register_environment_version,
)
from governance_loop.worker import build_worker as build_governance_worker
from tests.factories import make_person, record_decision
from tests.factories_governance import wait_for
from tests.factories_learning import loops_running, make_run, make_user, rows, run_config, start_run
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

pytestmark = [pytest.mark.integration, pytest.mark.slow]
CONTRACT = CONTRACTS_DIR / "tool_arithmetic_agent.yaml"


@contextlib.asynccontextmanager
async def admission_workers(settings: Settings, gov: Engine) -> AsyncIterator[Client]:
    """Governance's real worker and the real execution worker (with its probe)."""
    from execution_loop.worker import build_worker as build_execution_worker

    client = await connect(settings, identity="admission-test", service="governance")
    timing = replace(PromotionTiming.for_profile("test"), approval_deadline_s=120.0)
    governance = build_governance_worker(client, settings, engine=gov,
                                         authorizer=build_authorizer(settings, "governance"),
                                         timing=timing)
    execution = build_execution_worker(
        await loop_client(settings, "execution", "execution-test"), settings,
        max_concurrent_episodes=2)
    async with governance, execution:
        yield client


async def admit(settings: Settings, owner: Engine, gov: Engine, web: Engine,
                task_id: str) -> AdmissionResult:
    """AdmissionWorkflow with the real probe; an operator approves the admissible task."""
    async with admission_workers(settings, gov) as client:
        handle = await client.start_workflow(
            ADMISSION_WORKFLOW, AdmissionInput(task_id=task_id, requested_by="gov-admin"),
            id=admission_workflow_id(task_id), task_queue=settings.task_queue(GOVERNANCE_QUEUE),
            result_type=AdmissionResult)

        async def assessed() -> AdmissionResult | None:
            status: AdmissionResult = await handle.query(ADMISSION_STATUS_QUERY,
                                                         result_type=AdmissionResult)
            return status if status.status != "assessing" else None

        status = await wait_for(assessed, timeout=240, what="the admission assessment")
        assert status.admissible, status.reasons
        make_person(owner, "olive", ["operator"])
        decision = DecisionRef(record_decision(web, kind="admission", subject=task_id,
                                               decision="approve", user="olive",
                                               comment="probe evidence checked", owner=owner))
        await handle.execute_update(ADMISSION_DECIDE_UPDATE, decision)
        result: AdmissionResult = await asyncio.wait_for(handle.result(), 60)
    return result


async def test_a_black_box_agent_is_admitted_and_trained_through_the_gateway(
    settings: Settings, owner_engine: Engine, role_engine: Any, tiny_dir: Path
) -> None:
    gov = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    document = document_from_file(CONTRACT, name="tool_arithmetic_agent")
    assert document.contract["agent"]["command"] == ["{python}", "arithmetic_agent.py"]
    version = register_environment_version(engine=gov, authorizer=authorizer,
                                           document=document, requested_by="gov-admin")
    task_id = add_task(engine=gov, authorizer=authorizer, version_ref=version.id, seed=21,
                       requested_by="gov-admin")

    admitted = await admit(own_queues(settings, "bba-"), owner_engine, gov,
                           role_engine("web"), task_id)
    assert (admitted.status, admitted.decided_by) == ("admitted", "olive")
    [probe] = rows(owner_engine, "SELECT evidence->'probe' AS p FROM task WHERE id = :t",
                   t=task_id)
    assert probe["p"]["reference_results"] and all(probe["p"]["reference_results"])
    assert probe["p"]["verifier_ran_out_of_process"]

    train_settings = own_queues(settings, "bbt-")
    client = await connect(train_settings, identity="web-test", service="web", loop="learning")
    alice = make_user(owner_engine)
    config = run_config(tiny_dir, [task_id],
                        rollout={"group_size": 2, "groups_per_iteration": 1, "deadline_s": 240},
                        schedule={"iterations": 2, "propose_every": 2},
                        # A random tiny model earns the same (zero) reward on every episode;
                        # the KL term gives the update something to do on them anyway.
                        objective={"kl_coef": 0.01})
    run_id = make_run(owner_engine, config, alice)
    async with loops_running(client, train_settings):
        handle = await start_run(client, train_settings, run_id, config, alice)
        result: RunStatus = await asyncio.wait_for(handle.result(), 600)
    assert result.iterations_done == 2
    assert result.status in ("completed", "completed_with_alarms")

    episodes = rows(owner_engine, "SELECT id, status, failure_reason, num_steps, outcome "
                    "FROM trajectory WHERE run_id = :r ORDER BY id", r=run_id)
    assert len(episodes) == 4  # 2 iterations x 1 group x 2 samples
    for episode in episodes:
        gateway, agent = episode["outcome"]["gateway"], episode["outcome"]["agent"]
        # The worker's wiring: bubblewrap (reaching only the gateway) where it works.
        if bubblewrap_problem() is None:
            assert agent["sandbox"]["backend"] == "bubblewrap"
        else:
            assert agent["sandbox"]["backend"] == "local" and agent["sandbox"]["why"]
        assert episode["status"] in ("completed", "truncated"), agent["stderr_tail"]
        assert episode["num_steps"] == gateway["main_calls"] >= 1
        # Every call the model answered is in the record with its kind and rule.
        assert sum(gateway["kinds"].values()) == len(gateway["calls"])
        assert len(gateway["breaks"]) == gateway["segments"] - 1
    steps = rows(owner_engine, "SELECT t.batch_id, s.trajectory_id, s.feedback FROM step s"
                 " JOIN trajectory t ON t.id = s.trajectory_id WHERE t.run_id = :r", r=run_id)
    assert steps
    with Session(owner_engine) as session:  # each episode's calls, sliced out of its sequence
        turns = {tid: load_turn_tokens(session=session, trajectory_id=tid)
                 for tid in {s["trajectory_id"] for s in steps}}
    for step in steps:
        assert step["feedback"]["kind"] == "main"
    for calls in turns.values():
        for turn in calls:
            assert len(turn.behaviour_logprobs) == len(turn.action_token_ids)
    trained = rows(owner_engine, "SELECT iteration, trainable_tokens FROM training_step "
                   "WHERE run_id = :r ORDER BY iteration", r=run_id)
    assert [t["iteration"] for t in trained] == [1, 2]
    # The first update (nothing stale yet) trained on exactly the tokens the model sampled
    # in the main loop of its batch's episodes.
    first_batch = [s for s in steps if s["batch_id"].startswith(f"{run_id}-1-")]
    assert trained[0]["trainable_tokens"] == sum(
        len(t.action_token_ids) for tid in {s["trajectory_id"] for s in first_batch}
        for t in turns[tid])
