"""Issue 26's Done-when: a reasoning-gym task set of 1,000 generated tasks is registered,
admitted with one decision, split three ways and trained on for two iterations; its eval
split is frozen as an eval set and the candidate is judged on it by the offline-eval gate.

Everything is real and goes through the web API as people use it: OPA for each person,
Temporal, governance's worker (``TaskSetRegistration`` calling the execution loop's
``describe_tasks``; the set's ``TaskSetAdmission`` probing a seeded sample with the real
admission probe, the reasoning-gym verifier in its own process; the ``PromotionWorkflow``),
the execution worker playing the tiny model, the learning workers training it, and the
verifier service whose verdicts the gate counts. The promotion is ended after its first
gate: shadow and canary are not what this test is about.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import Engine
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import ActivityEnvironment

from execution_loop.environments.registry import builtin_contract_path
from tests.factories import uid
from tests.factories_byo import register
from tests.factories_governance import TEST_SPEC, wait_for
from tests.factories_learning import rows
from tests.factories_web import Person, make_user
from tests.temporal_helpers import admin_client, loop_client, own_queues
from triloop.config import ServiceName, Settings
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    ADMISSION_STATUS_QUERY,
    TaskSetAdmissionResult,
    task_set_admission_workflow_id,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNT = 1000
# A seed of this test's own: another test's reasoning-gym tasks (seed 26) are other content.
# Three terms of two digits: with fewer, the 1,000 entries repeat some questions, and
# registration (rightly) refuses a set holding one item twice.
GENERATOR = {"dataset": "basic_arithmetic", "count": COUNT, "seed": 2601,
             "config": {"min_terms": 3, "max_terms": 3, "min_digits": 2, "max_digits": 2}}
# Three ways; a small eval split keeps the gate's two batches short (one episode per task).
SPLIT = {"by": "fraction", "train": 0.9, "eval": 0.05, "traffic": 0.05}
WAIT_S = 900.0  # a bound on each wait on a shared machine, not a measurement


@pytest.fixture(scope="module")
def rg_settings(settings: Settings) -> Settings:
    """Task queues (and Nexus endpoints) of this module's own: the web app and every worker."""
    return own_queues(settings, "rgts-")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rg_api(rg_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The web app on this module's queues, in-process (registration describes 1,000 tasks
    and waits for it: a longer Temporal timeout than the web tests' stand-ins need)."""
    from web.app import create_app

    app = create_app(rg_settings, temporal_timeout_s=600.0)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver",
                                 timeout=900.0) as client:
        yield client


@contextlib.asynccontextmanager
async def loops(settings: Settings, role_engine: Callable[[ServiceName], Engine],
                threshold_name: str) -> AsyncIterator[Client]:
    """Governance's, execution's and learning's real workers, each in its own namespace
    with its own token; yields a governance client (to read the admission's status)."""
    from execution_loop.worker import build_worker as build_execution_worker
    from governance_loop.durations import PromotionTiming
    from governance_loop.worker import build_worker as build_governance_worker
    from learning_loop.worker import build_worker as build_learning_workers

    governance = await connect(settings, identity="rgts-governance", service="governance")
    # Test timing, but the eval batches of 50 tasks and the operator's decision may take
    # longer than the test profile's seconds on a shared machine.
    timing = replace(PromotionTiming.for_tests(), eval_timeout_s=1200.0,
                     approval_deadline_s=1200.0)
    execution = await loop_client(settings, "execution", "rgts-execution")
    learning = await loop_client(settings, "learning", "rgts-learning")
    workers = [
        build_governance_worker(governance, settings, engine=role_engine("governance"),
                                authorizer=build_authorizer(settings, "governance"),
                                threshold_name=threshold_name, timing=timing),
        build_execution_worker(execution, settings, max_concurrent_episodes=4),
        *build_learning_workers(learning, settings),
    ]
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield governance


def short_contract(tmp_path: Path) -> Path:
    """The shipped contract with short replies, so the tiny model's turns are quick."""
    text = builtin_contract_path("reasoning_gym").read_text()
    path = tmp_path / "reasoning_gym.yaml"
    path.write_text(text.replace("max_tokens_per_turn: 256", "max_tokens_per_turn: 16"))
    return path


def base_checkpoint(settings: Settings, role_engine: Callable[[ServiceName], Engine],
                    tiny_dir: Path) -> str:
    """The tiny model as a root checkpoint, registered as the learning worker registers a
    run's base (so production can serve it before the run starts)."""
    from learning_loop.activities.bases import BaseActivities
    from learning_loop.contracts import RegisterBaseInput
    from triloop.artifact_backends import open_shared_store

    bases = BaseActivities(engine=role_engine("learning"),
                           authorizer=build_authorizer(settings, "learning"),
                           artifact_dir=settings.artifacts, store=open_shared_store(settings))
    registered = ActivityEnvironment().run(bases.register_base_checkpoint,
                                           RegisterBaseInput(uid("base-"), str(tiny_dir)))
    return str(registered.checkpoint_id)


async def _end_promotion(settings: Settings, workflow_id: str) -> None:
    """Cancel the promotion if it went on past offline eval (its close releases any slot
    it claimed); a promotion the gate rejected has ended already."""
    operator = await admin_client(settings, "governance")
    handle = operator.get_workflow_handle(workflow_id)
    if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        await handle.cancel()
    with contextlib.suppress(Exception):
        await handle.result()


async def test_a_thousand_reasoning_gym_tasks_registered_admitted_split_trained_and_judged(
    rg_api: httpx.AsyncClient, rg_settings: Settings, owner_engine: Engine,
    role_engine: Callable[[ServiceName], Engine], tiny_dir: Path, tmp_path: Path,
    verifier_service: None,
) -> None:
    del verifier_service  # running: the gate counts the verifier's verdicts
    operator: Person = make_user(owner_engine, "operator")
    engineer: Person = make_user(owner_engine, "ml_engineer")
    version = register(role_engine("governance"), rg_settings, short_contract(tmp_path),
                       "reasoning_gym")
    threshold_name = uid("rgts-thr-")
    async with loops(rg_settings, role_engine, threshold_name) as governance:
        # Registered from the generator: 1,000 tasks, each described (digest and tags).
        name = uid("arithmetic-")
        created = await rg_api.post("/api/task-sets", headers=operator.headers, json={
            "name": name, "environment": version, "generator": GENERATOR, "split": SPLIT,
            "tags": {"source": "reasoning-gym"}, "comment": "issue 26"})
        assert created.status_code == 201, created.text
        registered = created.json()
        task_set_id = registered["task_set_id"]
        assert registered["new_tasks"] == COUNT
        assert sum(registered["splits"].values()) == COUNT
        members = rows(owner_engine, "SELECT m.split, m.content_digest AS member_digest, "
                       "t.tags, t.content_digest, t.status FROM task_set_member m "
                       "JOIN task t ON t.id = m.task_id WHERE m.task_set_id = :s",
                       s=task_set_id)
        assert len(members) == COUNT
        assert len({m["content_digest"] for m in members}) == COUNT  # every task distinct
        assert all(m["member_digest"] == m["content_digest"] for m in members)
        splits = {split: sum(m["split"] == split for m in members)
                  for split in ("train", "eval", "traffic")}
        assert all(splits.values()), splits  # three ways, none empty
        assert splits == registered["splits"]
        assert all(m["tags"]["capability"] == "basic_arithmetic"
                   and m["tags"]["domain"] == "arithmetic"
                   and m["tags"]["source"] == "reasoning-gym" for m in members)
        assert {m["status"] for m in members} == {"pending"}

        # Admitted as one unit: a seeded sample probed for real, then one decision.
        admission = governance.get_workflow_handle(
            task_set_admission_workflow_id(task_set_id))

        async def assessed() -> TaskSetAdmissionResult | None:
            status: TaskSetAdmissionResult = await admission.query(
                ADMISSION_STATUS_QUERY, result_type=TaskSetAdmissionResult)
            return status if status.status != "assessing" else None

        status = await wait_for(assessed, timeout=WAIT_S, what="the set's assessment",
                                interval=0.5)
        assert (status.status, status.admissible) == ("awaiting_decision", True), status
        shown = (await rg_api.get(f"/api/task-sets/{task_set_id}",
                                  headers=operator.headers)).json()
        evidence = shown["evidence"]
        assert 0 < evidence["sample"]["size"] < COUNT
        assert evidence["sample"]["members"] == COUNT
        assert len(evidence["tasks"]) == evidence["sample"]["size"]
        assert evidence["failures"] == [] and evidence["admissible"] is True
        assert all(t["probe"]["environment"] == "reasoning_gym"
                   and t["probe"]["verifier_ran_out_of_process"] for t in evidence["tasks"])
        decided = await rg_api.post(f"/api/task-sets/{task_set_id}/admission",
                                    headers=operator.headers,
                                    json={"decision": "approve", "comment": "sample checked"})
        assert decided.status_code == 200, decided.text
        assert decided.json()["status"] == "admitted"
        statuses = rows(owner_engine, "SELECT t.status, count(*) AS n FROM task_set_member m "
                        "JOIN task t ON t.id = m.task_id WHERE m.task_set_id = :s "
                        "GROUP BY t.status", s=task_set_id)
        assert statuses == [{"status": "admitted", "n": COUNT}]  # every member, one decision
        decisions = rows(owner_engine, "SELECT count(*) AS n FROM human_decision WHERE "
                         "kind = 'task_set_admission' AND subject = :s", s=task_set_id)
        assert decisions == [{"n": 1}]

        # The eval split frozen as an eval set, and a threshold judging this environment's
        # candidates on it (no stability window: the gate under test is offline eval).
        frozen = await rg_api.post("/api/eval-sets", headers=operator.headers, json={
            "name": f"{name}-eval", "from_task_set": task_set_id, "split": "eval",
            "comment": "the held-out split"})
        assert frozen.status_code == 201, frozen.text
        eval_set_id, eval_tasks = frozen.json()["eval_set_id"], frozen.json()["task_ids"]
        eval_split = [r["task_id"] for r in rows(
            owner_engine, "SELECT task_id FROM task_set_member WHERE task_set_id = :s "
            "AND split = 'eval' ORDER BY ordinal", s=task_set_id)]
        assert eval_tasks == eval_split
        threshold = await rg_api.post("/api/thresholds", headers=operator.headers, json={
            "name": threshold_name, "eval_sets": {"reasoning_gym": [eval_set_id]},
            "spec": {**TEST_SPEC, "stability": {"alarm_window_iterations": 0}},
            "comment": "reasoning-gym candidates on their own eval split"})
        assert threshold.status_code == 201, threshold.text

        # Production serves the tiny base; the run trains from it on the train split.
        from governance_loop.activities.rollback import bootstrap_production

        base = base_checkpoint(rg_settings, role_engine, tiny_dir)
        bootstrap_production(engine=role_engine("governance"),
                             authorizer=build_authorizer(rg_settings, "governance"),
                             checkpoint_id=base, requested_by="gov-admin", replace=True)
        submitted = await rg_api.post("/api/runs", headers=engineer.headers, json={"config": {
            "name": "reasoning-gym 1k",
            "model": {"base": base},
            "rollout": {"task_sets": [{"task_set": task_set_id, "split": "train"}],
                        "group_size": 4, "groups_per_iteration": 2, "temperature": 1.0,
                        "deadline_s": 300},
            "optimizer": {"learning_rate": 1e-2},
            # The tiny model solves no sum, so every group's advantage is 0: the entropy
            # bonus moves the weights, or the candidate would be the base itself.
            "objective": {"entropy_coef": 0.01},
            "update": {"micro_batch_size": 64},
            "stability": {"pause_on_alarm": False},
            "schedule": {"iterations": 2, "propose_every": 2, "seed": 0}}})
        assert submitted.status_code == 201, submitted.text
        run_id = submitted.json()["id"]

        async def finished() -> dict[str, Any] | None:
            run = (await rg_api.get(f"/api/runs/{run_id}", headers=engineer.headers)).json()
            return run if run["status"] not in ("submitted", "running", "paused") else None

        run = await wait_for(finished, timeout=WAIT_S, what="the run", interval=0.5)
        assert run["status"] in ("completed", "completed_with_alarms"), run
        assert run["iterations_done"] == 2
        [stored] = rows(owner_engine, "SELECT config FROM training_run WHERE id = :r",
                        r=run_id)
        train_split = [r["task_id"] for r in rows(
            owner_engine, "SELECT task_id FROM task_set_member WHERE task_set_id = :s "
            "AND split = 'train' ORDER BY ordinal", s=task_set_id)]
        assert stored["config"]["rollout"]["task_ids"] == train_split
        played = rows(owner_engine, "SELECT DISTINCT m.split FROM trajectory j JOIN "
                      "task_set_member m ON m.task_id = j.task_id WHERE j.run_id = :r "
                      "AND j.purpose = 'training' AND m.task_set_id = :s",
                      r=run_id, s=task_set_id)
        assert played == [{"split": "train"}]  # never an eval or traffic task
        assert len(rows(owner_engine, "SELECT 1 FROM training_step WHERE run_id = :r",
                        r=run_id)) == 2

        # Judged by the gate: the run's candidate on the frozen eval split.
        def promotion() -> dict[str, Any] | None:
            found = rows(owner_engine, "SELECT id, workflow_id, checkpoint_id FROM promotion "
                         "WHERE run_id = :r", r=run_id)
            return found[0] if found and found[0]["workflow_id"] else None

        opened = await wait_for(promotion, timeout=WAIT_S, what="the run's promotion")
        assert opened["checkpoint_id"] != base  # a trained candidate, not production's model

        def judged() -> dict[str, Any] | None:
            found = rows(owner_engine, "SELECT passed, reasons, evidence, eval_set_id "
                         "FROM gate_result WHERE promotion_id = :p AND gate = 'offline_eval'",
                         p=opened["id"])
            return found[0] if found else None

        try:
            gate = await wait_for(judged, timeout=WAIT_S, what="the offline-eval gate",
                                  interval=0.5)
        finally:
            await _end_promotion(rg_settings, opened["workflow_id"])
    evidence = gate["evidence"]
    assert gate["eval_set_id"] == eval_set_id, gate
    assert [e["eval_set"] for e in evidence["eval_sets"]] == [f"{name}-eval@v1"], evidence
    assert evidence["judged_for"] == {"reasoning_gym": [eval_set_id]}
    held = evidence["held_out"]
    assert held["run_id"] == run_id and held["overlaps"] == []
    assert held["eval_tasks"] == len(eval_tasks)
    assert held["content_digests"] == {
        "training_with_digest": len(train_split), "training_without_digest": 0,
        "eval_with_digest": len(eval_tasks), "eval_without_digest": 0, "shared_digests": []}
    # Both arms played the eval split, each task once, and nothing else.
    for arm in ("candidate", "production"):
        batch = evidence["batches_bound"][arm]
        episodes = rows(owner_engine, "SELECT task_id FROM trajectory WHERE batch_id = :b",
                        b=batch)
        assert sorted(e["task_id"] for e in episodes) == sorted(eval_tasks), arm
        assert [e["candidate" if arm == "candidate" else "production"]["episodes"]
                for e in evidence["eval_sets"]] == [len(eval_tasks)]
