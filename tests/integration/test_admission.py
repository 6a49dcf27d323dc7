"""AdmissionWorkflow against the real Temporal, PostgreSQL and OPA.

The execution loop's ``probe_admission`` is a stand-in registered under its real
name on the test's execution queue, returning evidence the test chooses; the
workflow, the assessment, the stored evidence and the operator's decision are real.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlmodel import Session
from temporalio import activity
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from execution_loop.contracts import PROBE_ADMISSION
from execution_loop.workflows import AdmissionProbeWorkflow
from governance_loop import store
from governance_loop.durations import PromotionTiming
from governance_loop.environments import retire_environment_version
from governance_loop.worker import build_worker
from learning_loop.store import get_tasks
from tests.factories import make_person, make_task, record_decision
from tests.factories_governance import wait_for
from tests.temporal_helpers import execution_nexus, loop_client, own_queues
from triloop.config import Settings
from triloop.models import EnvironmentVersion
from triloop.policy import Authorizer
from triloop.temporal import connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    ADMISSION_DECIDE_UPDATE,
    ADMISSION_STATUS_QUERY,
    ADMISSION_WORKFLOW,
    EXECUTION_QUEUE,
    GOVERNANCE_QUEUE,
    AdmissionInput,
    AdmissionProbeEvidence,
    AdmissionProbeInput,
    AdmissionResult,
    DecisionRef,
    RewardHackTrial,
    admission_workflow_id,
)

pytestmark = pytest.mark.integration

VERIFIER = "a" * 64
# task id -> how the stand-in probe behaves: good | flaky_reset | broken
PROBE_MODES: dict[str, str] = {}


@activity.defn(name=PROBE_ADMISSION.name)
def standin_probe(request: AdmissionProbeInput) -> AdmissionProbeEvidence:
    """Evidence as the execution loop would report it, shaped by ``PROBE_MODES``."""
    mode = PROBE_MODES.get(request.task_id, "good")
    if mode == "broken":
        raise ApplicationError("environment failed to start", non_retryable=True)
    prints = [f"obs-{i if mode == 'flaky_reset' else 0}" for i in range(request.resets)]
    return AdmissionProbeEvidence(
        task_id=request.task_id, environment_version_id="v", environment="standin", seed=1,
        reset_fingerprints=prints, reset_seconds=[0.01] * request.resets,
        verifier_hash=VERIFIER, verifier_ran_out_of_process=True,
        reference_results=[True] * request.reference_runs,
        reward_hacks=[RewardHackTrial("atexit_report_overwrite", applicable=True)],
        content_digest=hashlib.sha256(request.task_id.encode()).hexdigest(),
        tags={"domain": "standin"},
    )


@pytest.fixture(scope="module")
def gov_settings(settings: Settings) -> Settings:
    """Task queues of this module only."""
    return own_queues(settings, "adm-")


@pytest.fixture(scope="module")
def authorizer(settings: Settings) -> Authorizer:
    """The governance service's authorizer."""
    return build_authorizer(settings, "governance")


@contextlib.asynccontextmanager
async def workers(client: Client, settings: Settings, engine: Engine, authorizer: Authorizer,
                  *, decision_deadline_s: float = 60.0) -> AsyncIterator[None]:
    """The governance worker, and in the execution namespace the real probe workflow and
    Nexus handlers with a stand-in probe activity."""
    from concurrent.futures import ThreadPoolExecutor

    timing = replace(PromotionTiming.for_profile("test"),
                     approval_deadline_s=decision_deadline_s)
    governance = build_worker(client, settings, engine=engine, authorizer=authorizer,
                              timing=timing)
    execution = await loop_client(settings, "execution", "execution-stand-in")
    probe = Worker(execution, task_queue=settings.task_queue(EXECUTION_QUEUE),
                   workflows=[AdmissionProbeWorkflow], activities=[standin_probe],
                   activity_executor=ThreadPoolExecutor(2),
                   nexus_service_handlers=[execution_nexus(settings)])
    async with governance, probe:
        yield


async def _start(client: Client, settings: Settings, task_id: str) -> WorkflowHandle[Any, Any]:
    return await client.start_workflow(
        ADMISSION_WORKFLOW, AdmissionInput(task_id=task_id, requested_by="gov-admin"),
        id=admission_workflow_id(task_id), task_queue=settings.task_queue(GOVERNANCE_QUEUE),
        result_type=AdmissionResult,
    )


async def _assessed(handle: WorkflowHandle[Any, Any]) -> AdmissionResult:
    async def ready() -> AdmissionResult | None:
        status: AdmissionResult = await handle.query(ADMISSION_STATUS_QUERY,
                                                     result_type=AdmissionResult)
        return status if status.status != "assessing" else None

    result: AdmissionResult = await wait_for(ready, timeout=60, what="the assessment")
    return result


Decide = Callable[..., DecisionRef]


@pytest.fixture
def decide(owner_engine: Engine, role_engine: Any) -> Decide:
    """``decide(task, user, roles, decision)``: a real person decides, as the web records it."""
    web = role_engine("web")

    def make(task_id: str, user: str, roles: list[str], decision: str,
             comment: str = "checked") -> DecisionRef:
        make_person(owner_engine, user, roles)
        return DecisionRef(record_decision(web, kind="admission", subject=task_id,
                                           decision=decision, user=user, comment=comment,
                                           owner=owner_engine))

    return make


def _task_row(owner: Engine, task_id: str) -> Any:
    with owner.connect() as conn:
        return conn.execute(text("SELECT status, decided_by, evidence FROM task WHERE id = :t"),
                            {"t": task_id}).one()


@pytest.fixture
async def client(gov_settings: Settings) -> Client:
    """A Temporal client."""
    return await connect(gov_settings, identity="admission-test", service="governance")


async def test_admissible_task_is_admitted_by_an_operator_only(
    client: Client, gov_settings: Settings, owner_engine: Engine, role_engine: Any,
    authorizer: Authorizer, decide: Decide,
) -> None:
    task_id = make_task(owner_engine, status="pending")
    gov = role_engine("governance")
    async with workers(client, gov_settings, gov, authorizer):
        handle = await _start(client, gov_settings, task_id)
        status = await _assessed(handle)
        assert status.status == "awaiting_decision" and status.admissible
        assert [r.split(":")[0] for r in status.reasons] == [
            "reproducible", "verifiable", "cheap_recovery", "repeatable"]
        for decision, why in [
            (decide(task_id, "bob", ["auditor"], "approve"), "does not hold the 'operator' role"),
            (decide(task_id, "carol", ["operator"], "approve", comment=" "), "needs a comment"),
            (decide(task_id, "carol", ["operator"], "maybe"), "unknown decision"),
        ]:
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(ADMISSION_DECIDE_UPDATE, decision)
            assert why in str(refused.value.cause)
        assert _task_row(owner_engine, task_id)[0] == "pending"
        await handle.execute_update(ADMISSION_DECIDE_UPDATE,
                                    decide(task_id, "carol", ["operator"], "approve"))
        final = await handle.result()
    assert final.status == "admitted" and final.decided_by == "carol"
    status_, decided_by, evidence = _task_row(owner_engine, task_id)
    assert (status_, decided_by) == ("admitted", "carol")
    assert evidence["probe"]["verifier_hash"] == VERIFIER
    assert evidence["assessment"]["admissible"] is True
    with owner_engine.connect() as conn:  # governance recorded what the probe said it is
        digest, tags = conn.execute(text(
            "SELECT content_digest, tags FROM task WHERE id = :t"), {"t": task_id}).one()
    assert digest == hashlib.sha256(task_id.encode()).hexdigest()
    assert tags == {"domain": "standin"}
    with Session(gov) as session:
        version = store.get_task(session=session, task_id=task_id).environment_version_id
    # The learning loop asks the same question with its own role before using tasks
    # (RunActivities.validate_run: admitted, on an environment version not retired).
    learning = role_engine("learning")
    assert get_tasks(engine=learning, task_ids=[task_id])[task_id].status == "admitted"
    with Session(learning) as session:
        live = session.get(EnvironmentVersion, version)
        assert live is not None and live.retired_at is None
    retire_environment_version(engine=gov, authorizer=authorizer, version_id=version,
                               requested_by="gov-admin")
    for service in ("governance", "learning"):
        with Session(role_engine(service)) as session:
            retired = session.get(EnvironmentVersion, version)
            assert retired is not None and retired.retired_at is not None


async def test_inadmissible_task_can_only_be_rejected(
    client: Client, gov_settings: Settings, owner_engine: Engine, role_engine: Any,
    authorizer: Authorizer, decide: Decide,
) -> None:
    flaky = make_task(owner_engine, status="pending")
    broken = make_task(owner_engine, status="pending")
    PROBE_MODES.update({flaky: "flaky_reset", broken: "broken"})
    async with workers(client, gov_settings, role_engine("governance"), authorizer):
        for task_id, why in [(flaky, "reproducible: failed"), (broken, "probe failed")]:
            handle = await _start(client, gov_settings, task_id)
            status = await _assessed(handle)
            assert status.admissible is False
            assert any(r.startswith(why) for r in status.reasons), status.reasons
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(ADMISSION_DECIDE_UPDATE,
                                            decide(task_id, "carol", ["operator"], "approve"))
            assert "can only be rejected" in str(refused.value.cause)
            await handle.execute_update(ADMISSION_DECIDE_UPDATE,
                                        decide(task_id, "carol", ["operator"], "reject"))
            assert (await handle.result()).status == "rejected"
            assert _task_row(owner_engine, task_id)[0] == "rejected"


async def test_no_decision_by_the_deadline_rejects(
    client: Client, gov_settings: Settings, owner_engine: Engine, role_engine: Any,
    authorizer: Authorizer,
) -> None:
    task_id = make_task(owner_engine, status="pending")
    async with workers(client, gov_settings, role_engine("governance"), authorizer,
                       decision_deadline_s=1.0):
        final = await (await _start(client, gov_settings, task_id)).result()
    assert final.status == "rejected"
    assert _task_row(owner_engine, task_id)[:2] == ("rejected", "governance")


async def test_retired_version_is_not_assessed(
    client: Client, gov_settings: Settings, owner_engine: Engine, role_engine: Any,
    authorizer: Authorizer,
) -> None:
    task_id = make_task(owner_engine, status="pending")
    gov = role_engine("governance")
    with Session(gov) as session:
        version = store.get_task(session=session, task_id=task_id).environment_version_id
    retire_environment_version(engine=gov, authorizer=authorizer, version_id=version,
                               requested_by="gov-admin")
    async with workers(client, gov_settings, gov, authorizer):
        final = await (await _start(client, gov_settings, task_id)).result()
    assert final.status == "rejected" and "retired" in final.reasons[0]
    assert _task_row(owner_engine, task_id)[0] == "pending"
