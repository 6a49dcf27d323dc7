"""Uploaded fixtures are what runs: an agent program sent with its contract is admitted and plays.

Governance registers the upload exactly as it does an API upload (``contract_document`` on
the decision's details) and publishes each fixture to the artifact store by its hash; the
real AdmissionWorkflow probes the task on the real execution worker, which lays the
fixtures out from the store (verified); an episode then runs the uploaded program's bytes.
Before, the worker looked only in the built-in contracts folder, and admission failed with
"Activity task failed".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from execution_loop.command_agent import run_command_episode
from execution_loop.environments.registry import CONTRACTS_DIR
from execution_loop.sandbox import LocalProcessSandbox
from execution_loop.serving import TaskEnvironments
from governance_loop.activities.writes import contract_document
from governance_loop.environments import add_task, register_environment_version
from learning_loop.tiny_model import build_tokenizer
from tests.factories import uid
from tests.factories_byo import admit
from tests.gateway_standins import ScriptedPolicy
from triloop.artifact_backends import open_store
from triloop.artifacts import ArtifactCorrupted
from triloop.config import Settings
from triloop.contract_upload import encode_fixture
from triloop.fixture_store import FixturesMissing
from triloop.wiring import build_authorizer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
AGENT_CONTRACT = CONTRACTS_DIR / "tool_arithmetic_agent.yaml"
UPLOADED = "agents/uploaded_agent.py"


def _upload(marker: str) -> tuple[str, dict[str, str], bytes]:
    """The shipped agent contract naming an agent program that exists only in the upload."""
    program = (f"import sys\nsys.stdin.read()\nprint({marker!r}, file=sys.stderr)\n").encode()
    text = (AGENT_CONTRACT.read_text()
            .replace("fixtures: [fixtures/agents/arithmetic_agent.py]", f"fixtures: [{UPLOADED}]")
            .replace("files: [fixtures/agents/arithmetic_agent.py]", f"files: [{UPLOADED}]")
            .replace('"arithmetic_agent.py"]', '"uploaded_agent.py"]')
            .replace("The tool_arithmetic task,", f"The tool_arithmetic task ({marker}),"))
    return text, {UPLOADED: encode_fixture(program)}, program


async def test_an_uploaded_agent_is_admitted_and_its_bytes_play_the_episode(
    settings: Settings, owner_engine: Engine, role_engine: Any
) -> None:
    gov, execution = role_engine("governance"), role_engine("execution")
    marker = uid("uploaded-agent-")
    text, fixtures, program = _upload(marker)
    document = contract_document("tool_arithmetic_uploaded",
                                 {"contract_yaml": text, "fixtures": fixtures})
    store = open_store(settings)
    version = register_environment_version(
        engine=gov, authorizer=build_authorizer(settings, "governance"), document=document,
        requested_by="gov-admin", fixtures=store)
    assert store.get_bytes(document.fixture_hashes[UPLOADED]) == program

    admitted = await admit(settings, owner_engine, gov, role_engine("web"), version.id, seed=21)
    assert admitted.status == "admitted", admitted

    environments = TaskEnvironments(engine=execution, fixtures=store,
                                    cache=settings.artifact_cache / "fixtures")
    opened = environments.task(admitted.task_id)
    assert opened.contract.source_dir is not None
    assert opened.contract.source_dir != CONTRACTS_DIR.resolve()
    assert (opened.contract.source_dir / UPLOADED).read_bytes() == program
    env = opened.open()
    try:
        record = run_command_episode(
            env, ScriptedPolicy(build_tokenizer(), []), contract=opened.contract,
            sandbox=LocalProcessSandbox(), seed=1, task_seed=opened.seed,
            limits=opened.contract.limits, python=sys.executable)
    finally:
        env.close()
    assert marker in record.extra["agent"]["stderr_tail"]  # the uploaded program ran
    assert (record.status, record.failure_reason) == ("truncated", "agent_exited")


def test_a_fixture_in_neither_the_store_nor_the_builtins_is_named_and_a_bad_copy_refused(
    settings: Settings, role_engine: Any, tmp_path: Path
) -> None:
    gov = role_engine("governance")
    authorizer = build_authorizer(settings, "governance")
    text, fixtures, _ = _upload(uid("unpublished-"))
    document = contract_document("tool_arithmetic_unpublished",
                                 {"contract_yaml": text, "fixtures": fixtures})
    # Registered without publishing (as versions were before): nothing to run it with.
    version = register_environment_version(engine=gov, authorizer=authorizer, document=document,
                                           requested_by="gov-admin")
    task_id = add_task(engine=gov, authorizer=authorizer, version_ref=version.id, seed=3,
                       requested_by="gov-admin")
    store = open_store(settings)
    environments = TaskEnvironments(engine=role_engine("execution"), fixtures=store,
                                    cache=tmp_path / "cache")
    digest = document.fixture_hashes[UPLOADED]
    with pytest.raises(FixturesMissing, match=f"fixture {UPLOADED} \\(sha256 {digest}\\)"):
        environments.task(task_id, pending_ok=True)

    # A stored copy that does not hash to the pinned digest is refused, never run.
    blob = Path(store.location) / "sha256" / digest[:2] / digest
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(b"print('not what was registered')\n")
    with pytest.raises(ArtifactCorrupted, match=digest):
        environments.task(task_id, pending_ok=True)
    blob.unlink()
