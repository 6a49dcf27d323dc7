"""Without bubblewrap, admission of an agent contract is refused, naming the package.

The probe runs as the worker runs it (outside Temporal), on a machine made to lack
bubblewrap for real: PATH holds no ``bwrap``. Its refusal is what governance records as the
probe's failure, so the task is not admissible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from execution_loop.admission_probe import AdmissionProbe
from execution_loop.environments.registry import CONTRACTS_DIR
from execution_loop.sandboxes import bubblewrap_problem
from execution_loop.serving import TaskEnvironments
from governance_loop.activities.admission import judge_probe
from governance_loop.admission import AdmissionBudgets
from governance_loop.environments import add_task, document_from_file, register_environment_version
from tests.factories_execution import make_task_on, register_contract
from tests.factories_governance import wait_for
from tests.integration.test_black_box_agent import CONTRACT, admission_workers
from tests.temporal_helpers import own_queues, terminate_as_operator
from triloop.config import Settings
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    ADMISSION_STATUS_QUERY,
    ADMISSION_WORKFLOW,
    GOVERNANCE_QUEUE,
    AdmissionInput,
    AdmissionProbeEvidence,
    AdmissionProbeInput,
    AdmissionResult,
    admission_workflow_id,
)

pytestmark = pytest.mark.integration

ALLOWS_UNISOLATED = "\nisolation:\n  allow_unisolated: true\n"


@pytest.fixture
def no_bubblewrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """This worker as on a machine without Debian's bubblewrap installed."""
    monkeypatch.delenv("TRILOOP_SANDBOX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no bwrap on it
    bubblewrap_problem.cache_clear()
    yield
    bubblewrap_problem.cache_clear()


def agent_task(engine: Engine, seed: int, extra: str = "") -> str:
    """A pending task of the shipped black-box agent contract (plus ``extra`` YAML)."""
    text = (CONTRACTS_DIR / "tool_arithmetic_agent.yaml").read_text(encoding="utf-8")
    version = register_contract(engine, text + extra, base_dir=CONTRACTS_DIR)
    return make_task_on(engine, version, seed=seed, status="pending")


def probe(engine: Engine, task_id: str) -> AdmissionProbeEvidence:
    activity = AdmissionProbe(environments=TaskEnvironments(engine=engine))
    request = AdmissionProbeInput(task_id=task_id, resets=2, reference_runs=1)
    return ActivityEnvironment().run(activity.probe_admission, request)


def test_an_agent_contract_without_bubblewrap_is_refused_naming_the_package(
    role_engine: Callable[[str], Engine], owner_engine: Engine, no_bubblewrap: None
) -> None:
    task = agent_task(owner_engine, seed=9311)
    with pytest.raises(ApplicationError) as refused:
        probe(role_engine("execution"), task)
    assert refused.value.non_retryable and refused.value.type == "SandboxUnavailable"
    message = str(refused.value)
    assert f"task {task} is refused" in message
    assert "bwrap is not installed" in message and "apt-get install bubblewrap" in message
    # What governance stores for it: the probe's failure, first, and not admissible.
    judged = judge_probe(task, None, message, pinned_verifier_hash=None,
                         budgets=AdmissionBudgets())
    assert judged["assessment"]["admissible"] is False
    assert judged["assessment"]["reasons"][0].startswith("probe failed: ")
    assert "bubblewrap" in judged["assessment"]["reasons"][0]


def test_an_agent_contract_that_allows_unisolated_code_is_probed_and_says_so(
    role_engine: Callable[[str], Engine], owner_engine: Engine, no_bubblewrap: None
) -> None:
    task = agent_task(owner_engine, seed=9312, extra=ALLOWS_UNISOLATED)
    evidence = probe(role_engine("execution"), task)
    assert evidence.reference_results == [True]
    assert len(set(evidence.reset_fingerprints)) == 1
    unisolated = [n for n in evidence.notes if "unisolated" in n]
    assert len(unisolated) == 1 and "bwrap is not installed" in unisolated[0]
    assert "isolation.allow_unisolated" in unisolated[0]


async def test_the_admission_workflow_refuses_an_agent_contract_without_bubblewrap(
    settings: Settings, role_engine: Callable[[str], Engine], no_bubblewrap: None
) -> None:
    """Governance's real AdmissionWorkflow and the real execution worker, end to end."""
    gov = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    version = register_environment_version(
        engine=gov, authorizer=authorizer, requested_by="gov-admin",
        document=document_from_file(CONTRACT, name="tool_arithmetic_agent"))
    task_id = add_task(engine=gov, authorizer=authorizer, version_ref=version.id, seed=9313,
                       requested_by="gov-admin")
    queues = own_queues(settings, "bbw-")
    async with admission_workers(queues, gov) as client:
        handle = await client.start_workflow(
            ADMISSION_WORKFLOW, AdmissionInput(task_id=task_id, requested_by="gov-admin"),
            id=admission_workflow_id(task_id), task_queue=queues.task_queue(GOVERNANCE_QUEUE),
            result_type=AdmissionResult)

        async def assessed() -> AdmissionResult | None:
            status: AdmissionResult = await handle.query(ADMISSION_STATUS_QUERY,
                                                         result_type=AdmissionResult)
            return status if status.status != "assessing" else None

        status = await wait_for(assessed, timeout=240, what="the admission assessment")
        await terminate_as_operator(queues, handle, "the test has its answer")
    assert not status.admissible
    assert status.reasons[0].startswith("probe failed: ")
    assert "apt-get install bubblewrap" in status.reasons[0], status.reasons
