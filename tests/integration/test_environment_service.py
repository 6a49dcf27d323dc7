"""An environment served over HTTP: the protocol, triloop's client, refusals, and training."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from execution_loop.admission_probe import RecordingSandbox
from execution_loop.environments import registry
from execution_loop.environments.service import (
    ServiceEnvironment,
    ServiceProtocolError,
    ServiceUnavailable,
)
from execution_loop.environments.service_verifier import ServiceVerdictError, verify
from tests.environment_services import SERVICE_DIR, free_port, reference_service, write_contract
from tests.factories_byo import admit, register, train_briefly
from tests.factories_learning import rows
from triloop.config import ServiceName, Settings
from triloop.contracts import ContractError, contract_id, load_contract

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "environment-service.openapi.json"


@pytest.fixture(scope="module")
def service_url() -> Iterator[str]:
    """The reference server, running as its own process for the module."""
    with reference_service() as url:
        yield url


def test_the_published_schema_is_the_reference_servers() -> None:
    import sys

    sys.path.insert(0, str(SERVICE_DIR))
    try:
        from letter_service import app  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(SERVICE_DIR))
    assert json.loads(SCHEMA.read_text()) == json.loads(json.dumps(app.openapi()))


@pytest.mark.integration
def test_a_served_environment_plays_and_is_verified_outside_the_worker(
    service_url: str, tmp_path: Path
) -> None:
    contract = load_contract(write_contract(tmp_path, service_url),
                             capabilities=registry.capabilities())
    sandbox = RecordingSandbox()
    env = registry.make_environment(contract, sandbox=sandbox)
    assert isinstance(env, ServiceEnvironment)
    first = env.reset(4)
    print_one = env.state_fingerprint()
    assert env.reset(4) == first and env.state_fingerprint() == print_one
    [answer] = registry.reference_solution(contract.task, 4, contract)
    result = env.step(f"I count {answer}.")
    assert result.done and result.reward == pytest.approx(0.1)  # the contract's process term
    outcome = env.outcome()
    assert outcome.success and outcome.reward == 1.0 and outcome.details["verified_by"] == "service"
    # The verdict came from triloop's verifier process, which asked the service itself.
    assert sandbox.verifier_references == ["execution_loop.environments.service_verifier:verify"]
    env.reset(4)
    env.step(str(int(answer) + 1))
    assert not env.outcome().success
    env.close()


@pytest.mark.integration
def test_a_service_that_is_not_the_pinned_one_is_refused(service_url: str, tmp_path: Path) -> None:
    other = write_contract(tmp_path, service_url, digest="0" * 64)
    with pytest.raises(ServiceProtocolError, match="the contract pins 0000"):
        registry.make_environment(load_contract(other))
    renamed = write_contract(tmp_path, service_url, replace=("task: letter_count_service",
                                                             "task: letter_count_other"))
    with pytest.raises(ServiceProtocolError, match="serves 'letter_count_service'"):
        registry.make_environment(load_contract(renamed))
    wider = write_contract(tmp_path, service_url, replace=("[answer]", "[answer, edit_source]"))
    with pytest.raises(ContractError, match="has no action 'edit_source'"):
        registry.make_environment(load_contract(wider))
    unreachable = write_contract(tmp_path, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ServiceUnavailable):
        registry.make_environment(load_contract(unreachable))


@pytest.mark.integration
def test_the_verifier_refuses_a_verdict_from_another_verifier(
    service_url: str, tmp_path: Path
) -> None:
    contract = load_contract(write_contract(tmp_path, service_url))
    env = registry.make_environment(contract)
    assert isinstance(env, ServiceEnvironment)
    env.reset(1)
    env.step("3")
    payload = {**env.verifier_request().payload, "verifier_digest": "f" * 64}
    with pytest.raises(ServiceVerdictError, match="not the pinned verifier"):
        verify(payload)
    env.close()


def test_the_endpoint_is_part_of_the_version(tmp_path: Path) -> None:
    one = load_contract(write_contract(tmp_path, "http://127.0.0.1:1"))
    two = load_contract(write_contract(tmp_path, "http://127.0.0.1:2"))
    assert contract_id(one) != contract_id(two)


@pytest.mark.integration
@pytest.mark.slow
async def test_a_served_environment_is_admitted_and_trained_on(
    service_url: str, tmp_path: Path, settings: Settings, owner_engine: Engine,
    role_engine: Callable[[ServiceName], Engine], tiny_dir: Path,
) -> None:
    governance, web = role_engine("governance"), role_engine("web")
    version = register(governance, settings, write_contract(tmp_path, service_url),
                       "letter_count_service")
    [stored] = rows(owner_engine, "SELECT code_hashes, verifier_hash FROM environment_version "
                    "WHERE id = :v", v=version)
    assert "execution_loop.environments.service_verifier" in stored["code_hashes"]

    admitted = await admit(settings, owner_engine, governance, web, version, seed=6)
    assert admitted.status == "admitted"
    [task] = rows(owner_engine, "SELECT id, evidence FROM task WHERE id = :t", t=admitted.task_id)
    probe = task["evidence"]["probe"]
    assert probe["verifier_ran_out_of_process"]
    assert probe["verifier_hash"] == stored["verifier_hash"]

    run_id, status = await train_briefly(settings, owner_engine, tiny_dir, [task["id"]])
    assert status.status in ("completed", "completed_with_alarms") and status.iterations_done == 2
    steps = rows(owner_engine, "SELECT trainable_tokens FROM training_step WHERE run_id = :r",
                 r=run_id)
    assert len(steps) == 2 and any(s["trainable_tokens"] > 0 for s in steps)
