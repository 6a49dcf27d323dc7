"""A task set admitted as one unit, against the real Temporal, PostgreSQL, OPA and web app.

``TaskSetAdmission`` runs on the real governance worker; the execution loop's
``probe_admission`` is its real Nexus operation and probe workflow with a stand-in probe
activity (as in test_admission.py) whose evidence the test chooses per task. The sets are
inserted as registration would leave them (tests/factories_task_sets.py); the operator
decides through ``POST /api/task-sets/{id}/admission``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import pytest
import typer
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from temporalio import activity
from temporalio.client import (
    Client,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateStage,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker
from typer.testing import CliRunner

from execution_loop.contracts import PROBE_ADMISSION
from execution_loop.workflows import AdmissionProbeWorkflow
from governance_loop.admission import AdmissionBudgets, sample_seed, sample_tasks
from governance_loop.durations import PromotionTiming
from governance_loop.worker import build_worker
from tests.factories import make_person, record_decision
from tests.factories_governance import wait_for
from tests.factories_task_sets import TaskSetRows, make_task_set
from tests.factories_web import Person, assert_problem
from tests.temporal_helpers import execution_nexus, loop_client, own_queues
from triloop.config import Settings
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    ADMISSION_DECIDE_UPDATE,
    ADMISSION_STATUS_QUERY,
    EXECUTION_QUEUE,
    GOVERNANCE_QUEUE,
    TASK_SET_ADMISSION_WORKFLOW,
    AdmissionProbeEvidence,
    AdmissionProbeInput,
    DecisionRef,
    RewardHackTrial,
    TaskSetAdmissionInput,
    TaskSetAdmissionResult,
    task_set_admission_workflow_id,
)

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

SAMPLE = 4
VERIFIER = "b" * 64
FLAKY: set[str] = set()  # tasks whose resets disagree
BROKEN: set[str] = set()  # tasks whose probe fails outright
HELD: dict[str, threading.Event] = {}  # tasks whose probe waits until the test lets it go


@activity.defn(name=PROBE_ADMISSION.name)
def standin_probe(request: AdmissionProbeInput) -> AdmissionProbeEvidence:
    """Evidence as the execution loop would report it: good unless FLAKY or BROKEN."""
    if request.task_id in HELD:
        assert HELD[request.task_id].wait(timeout=120), "the test never let the probe go"
    if request.task_id in BROKEN:
        raise ApplicationError("environment failed to start", non_retryable=True)
    flaky = request.task_id in FLAKY
    return AdmissionProbeEvidence(
        task_id=request.task_id, environment_version_id="v", environment="standin", seed=1,
        reset_fingerprints=[f"obs-{i if flaky else 0}" for i in range(request.resets)],
        reset_seconds=[0.01] * request.resets, verifier_hash=VERIFIER,
        verifier_ran_out_of_process=True, reference_results=[True] * request.reference_runs,
        reward_hacks=[RewardHackTrial("atexit_report_overwrite", applicable=True)],
    )


@pytest.fixture(scope="module")
def adm_settings(settings: Settings) -> Settings:
    """Task queues (and Nexus endpoints) of this module only."""
    return own_queues(settings, "tsa-")


@contextlib.asynccontextmanager
async def workers(settings: Settings, role_engine: Any, *,
                  deadline_s: float = 120.0) -> AsyncIterator[Client]:
    """The real governance worker (a sample of SAMPLE), and in the execution namespace the
    real probe workflow and Nexus handlers with the stand-in probe activity."""
    client = await connect(settings, identity="task-set-admission-test", service="governance")
    timing = replace(PromotionTiming.for_profile("test"), approval_deadline_s=deadline_s)
    governance = build_worker(client, settings, engine=role_engine("governance"),
                              authorizer=build_authorizer(settings, "governance"),
                              budgets=AdmissionBudgets(set_sample=SAMPLE), timing=timing)
    execution = await loop_client(settings, "execution", "execution-stand-in")
    probe = Worker(execution, task_queue=settings.task_queue(EXECUTION_QUEUE),
                   workflows=[AdmissionProbeWorkflow], activities=[standin_probe],
                   activity_executor=ThreadPoolExecutor(4),
                   nexus_service_handlers=[execution_nexus(settings)])
    async with governance, probe:
        yield client


async def _start(client: Client, settings: Settings, task_set: TaskSetRows
                 ) -> WorkflowHandle[Any, Any]:
    """What registration's last step does (interface 6): start the set's admission."""
    return await client.start_workflow(
        TASK_SET_ADMISSION_WORKFLOW, TaskSetAdmissionInput(task_set_id=task_set.id),
        id=task_set_admission_workflow_id(task_set.id),
        task_queue=settings.task_queue(GOVERNANCE_QUEUE), result_type=TaskSetAdmissionResult)


async def _assessed(handle: WorkflowHandle[Any, Any]) -> TaskSetAdmissionResult:
    async def ready() -> TaskSetAdmissionResult | None:
        status: TaskSetAdmissionResult = await handle.query(
            ADMISSION_STATUS_QUERY, result_type=TaskSetAdmissionResult)
        return status if status.status != "assessing" else None

    result: TaskSetAdmissionResult = await wait_for(ready, timeout=90, what="the assessment")
    return result


def _set_row(owner: Engine, task_set_id: str) -> Any:
    with owner.connect() as conn:
        return conn.execute(text("SELECT status, decided_by, evidence FROM task_set"
                                 " WHERE id = :i"), {"i": task_set_id}).one()


def _task_statuses(owner: Engine, task_ids: list[str]) -> dict[str, str]:
    with owner.connect() as conn:
        rows = conn.execute(text("SELECT id, status FROM task WHERE id = ANY(:i)"),
                            {"i": task_ids}).all()
    return {r.id: r.status for r in rows}


def _decisions(owner: Engine, task_set_id: str) -> int:
    with owner.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM human_decision WHERE kind = 'task_set_admission'"
            " AND subject = :s"), {"s": task_set_id}).scalar_one())


def _decision(role_engine: Any, owner: Engine, task_set_id: str, user: str, roles: list[str],
              decision: str, comment: str = "checked the sample") -> DecisionRef:
    """A person's decision recorded as the web service records it (the web role)."""
    make_person(owner, user, roles)
    return DecisionRef(record_decision(role_engine("web"), kind="task_set_admission",
                                       subject=task_set_id, decision=decision, user=user,
                                       comment=comment, owner=owner))


async def test_an_operator_admits_a_set_with_one_decision(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, role_engine: Any,
    adm_settings: Settings,
) -> None:
    task_set = make_task_set(owner_engine, splits=["train"] * 8 + ["eval", "traffic"])
    async with workers(adm_settings, role_engine) as client:
        handle = await _start(client, adm_settings, task_set)
        status = await _assessed(handle)
        seed = sample_seed(task_set.id)
        expected = sample_tasks(task_set.task_ids, seed=seed, size=SAMPLE)
        assert (status.status, status.admissible) == ("awaiting_decision", True)
        assert (status.members, status.sample_size, status.sample_seed) == (10, SAMPLE, seed)
        evidence = _set_row(owner_engine, task_set.id).evidence
        assert evidence["sample"] == {"size": SAMPLE, "seed": seed, "members": 10,
                                      "budget": SAMPLE, "task_ids": expected}
        assert [t["task_id"] for t in evidence["tasks"]] == expected
        assert all(t["assessment"]["admissible"] and t["probe"]["verifier_hash"] == VERIFIER
                   for t in evidence["tasks"])
        assert [r.split(":")[0] for r in evidence["tasks"][0]["assessment"]["reasons"]] == [
            "reproducible", "verifiable", "cheap_recovery", "repeatable"]
        assert evidence["failures"] == [] and evidence["admissible"] is True

        # The policy refuses an ML engineer before anything is recorded (OPA's denial).
        body = {"decision": "approve", "comment": "the sample passed"}
        assert_problem(await api.post(f"/api/task-sets/{task_set.id}/admission", json=body,
                                      headers=people["engineer"].headers), 403)
        # A decision needs a comment saying why.
        assert_problem(await api.post(f"/api/task-sets/{task_set.id}/admission",
                                      json={"decision": "approve", "comment": " "},
                                      headers=people["operator"].headers), 422, "comment")
        assert _decisions(owner_engine, task_set.id) == 0
        # Governance proves a decision itself: an auditor's, a blank one, are refused.
        for ref, why in [
            (_decision(role_engine, owner_engine, task_set.id, "tsa-bob", ["auditor"],
                       "approve"), "does not hold the 'operator' role"),
            (_decision(role_engine, owner_engine, task_set.id, "tsa-carol", ["operator"],
                       "approve", comment=" "), "needs a comment"),
        ]:
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(ADMISSION_DECIDE_UPDATE, ref)
            assert why in str(refused.value.cause)
        assert _set_row(owner_engine, task_set.id).status == "pending"

        # One decision, by a unique prefix of the set's id, admits the set and every task.
        decided = await api.post(f"/api/task-sets/{task_set.id[:12]}/admission", json=body,
                                 headers=people["operator"].headers)
        assert decided.status_code == 200, decided.text
        outcome = decided.json()
        assert (outcome["task_set_id"], outcome["status"]) == (task_set.id, "admitted")
        assert outcome["decided_by"] == people["operator"].name
        assert outcome["sample_size"] == SAMPLE and outcome["members"] == 10
        final = await handle.result()
    assert final.status == "admitted"
    row = _set_row(owner_engine, task_set.id)
    assert (row.status, row.decided_by) == ("admitted", people["operator"].name)
    assert row.evidence["decision"]["comment"] == "the sample passed"
    assert set(_task_statuses(owner_engine, task_set.task_ids).values()) == {"admitted"}
    with owner_engine.connect() as conn:
        why = conn.execute(text("SELECT evidence->'task_set_admission' FROM task WHERE id = :t"),
                           {"t": task_set.task_ids[-1]}).scalar_one()
        event = conn.execute(text(
            "SELECT payload FROM audit_event WHERE action = 'task_set_admitted'"
            " AND resource->>'id' = :i"), {"i": task_set.id}).one()
    assert why["task_set_id"] == task_set.id and why["user"] == people["operator"].name
    assert event.payload["tasks_changed"] == 10
    # Deciding twice: the API refuses a decided set, and records nothing more.
    assert_problem(await api.post(f"/api/task-sets/{task_set.id}/admission",
                                  json={"decision": "reject", "comment": "again"},
                                  headers=people["operator"].headers), 409, "already admitted")
    assert _decisions(owner_engine, task_set.id) == 3  # bob's, carol's blank one, the operator's


async def test_an_inadmissible_set_can_only_be_rejected(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, role_engine: Any,
    adm_settings: Settings,
) -> None:
    # Fewer tasks than the sample: every task is probed.
    task_set = make_task_set(owner_engine, splits=["train", "eval", "train"])
    flaky, broken = task_set.task_ids[1], task_set.task_ids[2]
    FLAKY.add(flaky)
    BROKEN.add(broken)
    async with workers(adm_settings, role_engine) as client:
        handle = await _start(client, adm_settings, task_set)
        status = await _assessed(handle)
        assert status.admissible is False and status.sample_size == 3
        assert any(f.startswith(f"{flaky}: reproducible: failed") for f in status.failures)
        assert any(f.startswith(f"{broken}: probe failed") for f in status.failures)
        assert not any(f.startswith(task_set.task_ids[0]) for f in status.failures)
        evidence = _set_row(owner_engine, task_set.id).evidence
        assert evidence["sample"]["size"] == 3 and evidence["failures"] == status.failures
        assert evidence["tasks"][2]["probe_error"] and evidence["tasks"][2]["probe"] is None
        url = f"/api/task-sets/{task_set.name}@1/admission"
        assert_problem(await api.post(url, json={"decision": "approve", "comment": "ship it"},
                                      headers=people["operator"].headers),
                       409, "not admissible", "can only be rejected", flaky)
        assert _decisions(owner_engine, task_set.id) == 0
        # Governance refuses it too, whoever asks it directly.
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(ADMISSION_DECIDE_UPDATE, _decision(
                role_engine, owner_engine, task_set.id, "tsa-olga", ["operator"], "approve"))
        assert "can only be rejected" in str(refused.value.cause)
        rejected = await api.post(url, json={"decision": "reject", "comment": "flaky resets"},
                                  headers=people["operator"].headers)
        assert rejected.status_code == 200, rejected.text
        assert rejected.json()["status"] == "rejected"
        assert (await handle.result()).status == "rejected"
        # A second decision reaches no workflow: the admission is over.
        with pytest.raises(RPCError, match="already completed"):
            await handle.execute_update(ADMISSION_DECIDE_UPDATE, _decision(
                role_engine, owner_engine, task_set.id, "tsa-olga", ["operator"], "reject"))
    assert _set_row(owner_engine, task_set.id).status == "rejected"
    assert set(_task_statuses(owner_engine, task_set.task_ids).values()) == {"rejected"}


async def test_a_decision_sent_while_the_sample_is_assessed_waits_for_the_evidence(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, role_engine: Any,
    adm_settings: Settings,
) -> None:
    """The web service lets a decision through once the evidence is on the set's row, a
    moment before the workflow knows it is assessed: such a decision is accepted and
    applied once the assessment ends, never refused as "assessing". Before any evidence
    the web service refuses a decision either way, recording nothing."""
    task_set = make_task_set(owner_engine, splits=["train", "eval"])
    held = HELD.setdefault(task_set.task_ids[0], threading.Event())
    async with workers(adm_settings, role_engine) as client:
        handle = await _start(client, adm_settings, task_set)
        for decision in ("approve", "reject"):
            assert_problem(await api.post(f"/api/task-sets/{task_set.id}/admission",
                                          json={"decision": decision, "comment": "early"},
                                          headers=people["operator"].headers),
                           409, "has not been assessed yet")
        assert _decisions(owner_engine, task_set.id) == 0
        # As the web service sends it in that moment: accepted while still assessing.
        update = await handle.start_update(
            ADMISSION_DECIDE_UPDATE, _decision(role_engine, owner_engine, task_set.id,
                                               "tsa-dora", ["operator"], "approve"),
            wait_for_stage=WorkflowUpdateStage.ACCEPTED, result_type=TaskSetAdmissionResult)
        assert (await handle.query(ADMISSION_STATUS_QUERY,
                                   result_type=TaskSetAdmissionResult)).status == "assessing"
        held.set()
        decided: TaskSetAdmissionResult = await update.result()
        assert (decided.status, decided.admissible) == ("admitted", True)
        assert (await handle.result()).status == "admitted"
    assert set(_task_statuses(owner_engine, task_set.task_ids).values()) == {"admitted"}


async def test_no_decision_by_the_deadline_rejects_the_set(
    owner_engine: Engine, role_engine: Any, adm_settings: Settings,
) -> None:
    task_set = make_task_set(owner_engine, splits=["train", "train"])
    async with workers(adm_settings, role_engine, deadline_s=1.0) as client:
        final = await (await _start(client, adm_settings, task_set)).result()
    assert (final.status, final.decided_by) == ("rejected", "governance")
    assert _set_row(owner_engine, task_set.id)[:2] == ("rejected", "governance")
    assert set(_task_statuses(owner_engine, task_set.task_ids).values()) == {"rejected"}


async def test_a_set_holding_a_rejected_task_is_not_admitted_and_others_keep_theirs(
    owner_engine: Engine, role_engine: Any, adm_settings: Settings,
) -> None:
    task_set = make_task_set(owner_engine, splits=["train", "train", "train"])
    with owner_engine.begin() as conn:  # decided before, by another decision
        conn.execute(text("UPDATE task SET status = 'rejected' WHERE id = :t"),
                     {"t": task_set.task_ids[0]})
        conn.execute(text("UPDATE task SET status = 'admitted' WHERE id = :t"),
                     {"t": task_set.task_ids[1]})
    async with workers(adm_settings, role_engine) as client:
        handle = await _start(client, adm_settings, task_set)
        assert (await _assessed(handle)).admissible is True
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(ADMISSION_DECIDE_UPDATE, _decision(
                role_engine, owner_engine, task_set.id, "tsa-olga", ["operator"], "approve"))
        assert f"holds rejected task(s) {task_set.task_ids[0]}" in str(refused.value.cause)
        result: TaskSetAdmissionResult = await handle.execute_update(
            ADMISSION_DECIDE_UPDATE, _decision(role_engine, owner_engine, task_set.id,
                                               "tsa-olga", ["operator"], "reject"),
            result_type=TaskSetAdmissionResult)
    assert result.status == "rejected"
    assert _task_statuses(owner_engine, task_set.task_ids) == {
        task_set.task_ids[0]: "rejected", task_set.task_ids[1]: "admitted",
        task_set.task_ids[2]: "rejected"}


@pytest.fixture
def governance_cli(monkeypatch: pytest.MonkeyPatch, web_app: FastAPI) -> typer.Typer:
    """``triloop governance``, its API calls answered by the test app in-process."""
    from governance_loop.cli import governance_app

    client = TestClient(web_app)

    def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("timeout", None)
        return client.request(method, url.replace("http://127.0.0.1:8000", ""), **kwargs)

    monkeypatch.setattr(httpx, "request", request)
    return governance_app


async def test_task_set_admit_decides_through_the_api_with_the_persons_token(
    governance_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine,
    role_engine: Any, adm_settings: Settings,
) -> None:
    task_set = make_task_set(owner_engine, splits=["train", "eval"])
    runner = CliRunner()

    def admit(*args: str) -> Any:
        return runner.invoke(governance_cli, ["task-set", "admit", task_set.id[:10], *args])

    async with workers(adm_settings, role_engine) as client:
        handle = await _start(client, adm_settings, task_set)
        await _assessed(handle)
        blank = await asyncio.to_thread(admit, "--approve", "--comment", " ", "--token",
                                        people["operator"].token)
        assert blank.exit_code == 1 and "--comment is required" in blank.output
        denied = await asyncio.to_thread(admit, "--approve", "--comment", "ok", "--token",
                                         people["engineer"].token)
        assert denied.exit_code == 1 and "403" in denied.output
        done = await asyncio.to_thread(admit, "--approve", "--comment", "sample passed",
                                       "--token", people["operator"].token)
        assert done.exit_code == 0, done.output
        assert f"task set {task_set.id}: admitted (admissible=True, 2 of 2" in done.output
        await handle.result()
    assert set(_task_statuses(owner_engine, task_set.task_ids).values()) == {"admitted"}
