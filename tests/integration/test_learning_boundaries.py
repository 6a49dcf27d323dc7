"""The loop that learns trains only on held-out tasks and cannot read or forge what judges it
(issue 32, routes 6 and 7).

Each attack uses only the credentials the issue names: learning's Temporal token (through
Nexus), the execution or learning database role (``Settings.role_url``). Refusals that
reach a policy decision are in the audit log.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError
from temporalio import workflow
from temporalio.exceptions import NexusOperationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from governance_loop.activities.evidence import EvidenceActivities
from governance_loop.contracts import OfflineEvalInput
from governance_loop.evalsets import create_eval_set, set_threshold
from tests.factories import (
    insert,
    make_checkpoint,
    make_eval_set,
    make_person,
    make_run,
    make_task,
    uid,
)
from tests.factories_governance import TEST_SPEC
from tests.factories_web import make_promotion
from tests.temporal_helpers import InstantRollout, execution_nexus, loop_client, own_queues
from triloop.config import Settings
from triloop.nexus_api import ExecutionService, endpoint_for
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    LEARNING_QUEUE,
    RolloutBatchInput,
    RolloutItem,
)

pytestmark = pytest.mark.integration

Roles = Callable[[str], Engine]


def _run(engine: Engine, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    with engine.begin() as conn:
        result = conn.execute(text(sql), params or {})
        return list(result.all()) if result.returns_rows else []


def _denied(engine: Engine, sql: str, params: dict[str, Any] | None = None) -> str:
    """Refused with SQLSTATE 42501 (no grant, or a trigger's insufficient_privilege)."""
    with pytest.raises((ProgrammingError, DBAPIError)) as caught:
        _run(engine, sql, params)
    assert getattr(caught.value.orig, "sqlstate", None) == "42501", caught.value.orig
    return str(caught.value.orig)


def _frozen_eval_task(owner: Engine) -> str:
    """A task of a frozen eval set."""
    task_id, set_id = make_task(owner), make_eval_set(owner)
    insert(owner, "eval_item", eval_set_id=set_id, ordinal=0, task_id=task_id)
    _run(owner, "UPDATE eval_set SET frozen_at = now(), content_hash = 'h' WHERE id = :s",
         {"s": set_id})
    return task_id


def _traffic_task(owner: Engine) -> str:
    """A task that production traffic played (people asked for the batch)."""
    task_id, batch = make_task(owner), uid("traffic-")
    insert(owner, "rollout_batch", id=batch, purpose="production", requested_by="web")
    insert(owner, "trajectory", id=uid("ep-"), batch_id=batch, task_id=task_id,
           checkpoint_id="c-prod", purpose="production", group_id="g", status="completed",
           total_reward=1.0, sample_index=0, policy_version=0, success=True, num_steps=1)
    return task_id


def _twin(owner: Engine, task_id: str) -> str:
    """The same world (environment and seed) as ``task_id`` under a new version and id."""
    (environment, version, seed), = _run(owner, (
        "SELECT v.environment_name, v.version, t.seed FROM task t JOIN environment_version v "
        "ON v.id = t.environment_version_id WHERE t.id = :t"), {"t": task_id})
    version_id = uid("sha-")
    insert(owner, "environment_version", id=version_id, environment_name=environment,
           version=version + 1, contract={"task": environment}, contract_text="task: x",
           fixture_hashes={}, created_by="test")
    twin = uid("task-")
    insert(owner, "task", id=twin, environment_version_id=version_id, seed=seed,
           status="admitted", evidence={})
    return twin


HELD_OUT = {"frozen eval set": _frozen_eval_task, "production traffic": _traffic_task}


# -- route 6: training batches on held-out tasks --------------------------------------------


@workflow.defn(name="AskForTraining")
class AskForTraining:
    """A learning workflow asking execution for a training batch on one task."""

    @workflow.run
    async def run(self, task_id: str) -> str:
        execution = workflow.create_nexus_client(
            service=ExecutionService,
            endpoint=endpoint_for(workflow.info().task_queue, "execution"))
        result = await execution.execute_operation(
            ExecutionService.run_rollouts,
            RolloutBatchInput(batch_id=f"held-{workflow.info().run_id[:12]}",
                              purpose="training", items=[RolloutItem(task_id, 0, 2)],
                              checkpoint_id="c-train"),
            schedule_to_close_timeout=timedelta(seconds=60))
        return result.batch_id


async def test_learning_may_not_ask_execution_to_train_on_held_out_tasks(
    settings: Settings, owner_engine: Engine,
) -> None:
    own = own_queues(settings, "heldout-")
    learning = await loop_client(own, "learning", "learning-test")
    execution = await loop_client(own, "execution", "execution-test")
    queue = own.task_queue(LEARNING_QUEUE)
    tasks = {why: make(owner_engine) for why, make in HELD_OUT.items()}
    tasks["same world as a frozen eval task"] = _twin(owner_engine, tasks["frozen eval set"])
    refusals: dict[str, BaseException | None] = {}
    async with Worker(learning, task_queue=queue, workflows=[AskForTraining],
                      workflow_runner=UnsandboxedWorkflowRunner()), \
            Worker(execution, task_queue=own.task_queue(EXECUTION_QUEUE),
                   workflows=[InstantRollout], workflow_runner=UnsandboxedWorkflowRunner(),
                   nexus_service_handlers=[execution_nexus(own)]):
        served = await learning.execute_workflow(
            AskForTraining.run, make_task(owner_engine), id=f"ask-{uuid.uuid4().hex[:8]}",
            task_queue=queue)
        for why, task_id in tasks.items():
            with pytest.raises(Exception) as refused:
                await learning.execute_workflow(AskForTraining.run, task_id,
                                                id=f"ask-{uuid.uuid4().hex[:8]}",
                                                task_queue=queue)
            refusals[why] = refused.value.__cause__
    assert served.startswith("held-")  # a task nothing holds out is served
    for why, task_id in tasks.items():
        failure = refusals[why]
        assert isinstance(failure, NexusOperationError), why
        assert "execution refuses run_rollouts (training) to learning" in str(failure.__cause__)
        assert f"task {task_id} " in str(failure.__cause__), why
    denied = _run(owner_engine, (
        "SELECT resource->'attrs'->'task_ids'->>0, payload->'reasons' FROM audit_event "
        "WHERE action = 'serve' AND decision = 'deny' AND db_role = 'triloop_execution' "
        "AND resource->>'id' = 'run_rollouts' AND resource->'attrs'->'task_ids' ?| :t"),
        {"t": list(tasks.values())})
    assert {row[0] for row in denied} == set(tasks.values())
    for task_id, reasons in denied:
        assert any(f"task {task_id} " in reason and "training stays off" in reason
                   for reason in reasons)
    # Nothing was recorded as asked for: no batch row, so no episode could be stored.
    assert not _run(owner_engine, "SELECT id FROM rollout_batch WHERE task_ids && :t",
                    {"t": list(tasks.values())})


# Execution records learning's training batch with its tasks and the episodes it plans (0021):
# here one episode, :i on task :t.
PLAN = "jsonb_build_object(CAST(:i AS text), jsonb_build_object('task_id', CAST(:t AS text), " \
    "'seed', 0))"
BATCH = ("INSERT INTO rollout_batch (id, purpose, checkpoint_id, requested_by, task_ids, "
         f"planned_episodes) VALUES (:b, 'training', 'c', 'learning', ARRAY[:t], {PLAN})")
CLEAN_BATCH = ("INSERT INTO rollout_batch (id, purpose, checkpoint_id, requested_by, "
               f"planned_episodes) VALUES (:b, 'training', 'c', 'learning', {PLAN})")
TRAJECTORY = (
    "INSERT INTO trajectory (id, batch_id, task_id, checkpoint_id, purpose, group_id, status, "
    "total_reward, sample_index, policy_version, success, num_steps) "
    "VALUES (:i, :b, :t, 'c', 'training', 'g', 'completed', 1.0, 0, 0, true, 1)"
)


@pytest.mark.parametrize("twin", [False, True], ids=["same task", "same world"])
@pytest.mark.parametrize("held_by", list(HELD_OUT))
@pytest.mark.parametrize("row", ["rollout_batch", "trajectory"])
def test_the_database_refuses_training_rows_on_held_out_tasks(
    role_engine: Roles, owner_engine: Engine, row: str, held_by: str, twin: bool,
) -> None:
    execution = role_engine("execution")
    task_id = HELD_OUT[held_by](owner_engine)
    if twin:
        task_id = _twin(owner_engine, task_id)
    batch, episode = uid("b-"), uid("ep-")
    if row == "rollout_batch":
        refused = _denied(execution, BATCH, {"b": batch, "t": task_id, "i": episode})
    else:  # a batch that named no task, then its planned episode on a held-out one
        _run(execution, CLEAN_BATCH, {"b": batch, "t": task_id, "i": episode})
        refused = _denied(execution, TRAJECTORY, {"i": episode, "b": batch, "t": task_id})
    assert f"task {task_id} " in refused and held_by in refused
    # The same rows on a task nothing holds out are stored.
    clean, other, planned = make_task(owner_engine), uid("b-"), uid("ep-")
    _run(execution, BATCH, {"b": other, "t": clean, "i": planned})
    _run(execution, TRAJECTORY, {"i": planned, "b": other, "t": clean})


@pytest.mark.parametrize("evidence", ["trajectory of the run", "training batch of a checkpoint"])
def test_offline_eval_fails_a_run_whose_batches_trained_on_held_out_tasks(
    settings: Settings, role_engine: Roles, owner_engine: Engine, evidence: str,
) -> None:
    gov = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    tasks = [make_task(owner_engine) for _ in range(2)]
    eval_set = create_eval_set(engine=gov, authorizer=authorizer, name=uid("es-"),
                               task_ids=tasks, requested_by="gov-admin")
    threshold = set_threshold(engine=gov, authorizer=authorizer, name=uid("thr-"),
                              spec=TEST_SPEC, eval_set=eval_set.id, requested_by="gov-admin")
    seeded = make_promotion(owner_engine, submitted_by="sam")
    # The run's config names no eval task (its config is {}); what it asked for did.
    batch = uid("train-")
    if evidence == "trajectory of the run":
        insert(owner_engine, "rollout_batch", id=batch, purpose="training",
               run_id=seeded.run_id, requested_by="learning")
        insert(owner_engine, "trajectory", id=uid("ep-"), batch_id=batch, task_id=tasks[1],
               run_id=seeded.run_id, checkpoint_id=seeded.root_id, purpose="training",
               group_id="g", status="completed", total_reward=1.0, sample_index=0,
               policy_version=0, success=True, num_steps=1)
    else:
        _run(owner_engine, "INSERT INTO rollout_batch (id, purpose, checkpoint_id, requested_by,"
             " task_ids) VALUES (:b, 'training', :c, 'learning', ARRAY[:t])",
             {"b": batch, "c": seeded.parent_id, "t": tasks[0]})
    gate = EvidenceActivities(gov, authorizer)
    outcome = gate.decide_offline_eval(OfflineEvalInput(
        promotion_id=seeded.promotion_id, threshold_id=threshold.id, eval_set_id=eval_set.id,
        candidate_batch_id=uid("batch-"), production_batch_id=None))
    trained = tasks[1] if evidence == "trajectory of the run" else tasks[0]
    assert not outcome.passed and outcome.verdict == "fail"
    assert outcome.reasons == [f"not held out: training task {trained} is the same task"]
    (evidence_row,) = _run(owner_engine, "SELECT evidence FROM gate_result WHERE id = :g",
                           {"g": outcome.gate_result_id})
    assert evidence_row[0]["held_out"]["overlaps"] == [
        f"training task {trained} is the same task"]


# -- route 7: what learning may read and write ----------------------------------------------

JUDGING_READS = [
    "SELECT evidence FROM gate_result",
    "SELECT spec FROM threshold",
    "SELECT payload FROM audit_event",
    "SELECT comment FROM approval",
    "SELECT status_reason FROM promotion",
    "SELECT checkpoint_id FROM routing",
    "SELECT checkpoint_id FROM deployment",
    "SELECT reason FROM deployment_history",
    "SELECT task_id FROM eval_item",
    "SELECT * FROM access_event",
    "SELECT * FROM step",
    # Which tasks are held out is itself what learning must not learn.
    "SELECT * FROM triloop_held_out_conflicts(ARRAY['task'])",
]


@pytest.mark.parametrize("sql", JUDGING_READS)
def test_learning_may_not_read_what_judges_it(role_engine: Roles, sql: str) -> None:
    assert "permission denied" in _denied(role_engine("learning"), sql)


def test_learning_sees_its_training_batches_and_run_controls_only(
    role_engine: Roles, owner_engine: Engine,
) -> None:
    run_id = make_run(owner_engine)
    batches = {purpose: uid(f"{purpose}-") for purpose in ("training", "eval", "production",
                                                            "probe")}
    for purpose, batch in batches.items():
        insert(owner_engine, "rollout_batch", id=batch, purpose=purpose, run_id=run_id,
               requested_by={"training": "learning", "production": "web"}.get(
                   purpose, "governance"))
    person = make_person(owner_engine, uid("person-"), ["operator"])
    decisions = {kind: uid(f"{kind}-") for kind in ("run_control", "approval", "audit")}
    for kind, decision in decisions.items():
        insert(owner_engine, "human_decision", id=decision, kind=kind, subject=run_id,
               decision="pause" if kind == "run_control" else "approve", user_name=person,
               comment="what the person said", details={})
    learning = role_engine("learning")
    seen_batches = {r[0] for r in _run(learning, "SELECT id FROM rollout_batch WHERE id = ANY(:i)",
                                       {"i": list(batches.values())})}
    seen_decisions = {r[0] for r in _run(
        learning, "SELECT id FROM human_decision WHERE id = ANY(:i)",
        {"i": list(decisions.values())})}
    assert seen_batches == {batches["training"]}  # eval batch ids are governance's
    assert seen_decisions == {decisions["run_control"]}  # the decisions learning carries out
    for role in ("execution", "governance", "web", "verifier"):  # the verifier reads plans
        assert len(_run(role_engine(role), "SELECT id FROM rollout_batch WHERE id = ANY(:i)",
                        {"i": list(batches.values())})) == len(batches)


@pytest.mark.parametrize("service", ["execution", "learning", "governance", "web"])
def test_access_log_appends_only_through_the_function_that_stamps_the_role(
    role_engine: Roles, owner_engine: Engine, service: str,
) -> None:
    engine = role_engine(service)
    action = uid("read-")
    refused = _denied(engine, "INSERT INTO access_event (actor, action, resource, db_role) "
                      "VALUES ('{\"service\": \"web\"}', :a, '{}', 'triloop_web')", {"a": action})
    assert "permission denied" in refused
    _run(engine, "SELECT triloop_access_append(CAST(:actor AS jsonb), :a, '{}', NULL, NULL)",
         {"actor": json.dumps({"service": service}), "a": action})
    stored = _run(owner_engine, "SELECT db_role FROM access_event WHERE action = :a",
                  {"a": action})
    assert [r[0] for r in stored] == [f"triloop_{service}"]


PROPOSAL = ("INSERT INTO proposal (id, checkpoint_id, run_id, submitted_by) "
            "VALUES (:p, :c, :r, 'alice')")


def test_a_run_proposes_only_its_own_checkpoints(role_engine: Roles, owner_engine: Engine) -> None:
    learning = role_engine("learning")
    mine, theirs = make_run(owner_engine), make_run(owner_engine, submitted_by="mallory")
    root = make_checkpoint(owner_engine)
    own = make_checkpoint(owner_engine, parent_id=root, run_id=mine)
    other = make_checkpoint(owner_engine, parent_id=root, run_id=theirs)

    def propose(checkpoint: str, run_id: str) -> dict[str, str]:
        return {"p": uid("prop-"), "c": checkpoint, "r": run_id}

    refused = _denied(learning, PROPOSAL, propose(other, mine))
    assert f"belongs to run {theirs}, not to the proposing run {mine}" in refused
    assert "belongs to run (none)" in _denied(learning, PROPOSAL, propose(root, mine))
    _run(learning, PROPOSAL, propose(own, mine))
    # A run whose updates kept the base's weights proposes that base, once it trained on it.
    insert(owner_engine, "rollout_batch", id=uid("train-"), purpose="training",
           checkpoint_id=root, run_id=mine, requested_by="learning")
    _run(learning, PROPOSAL, propose(root, mine))
    _denied(learning, PROPOSAL, propose(root, theirs))
