"""Governance data: environment versions, eval sets, thresholds, and who may change them.

Real PostgreSQL (per-service roles) and real OPA. The learning loop's identity is
refused twice: by the policy and, even when a bug skips the policy, by its role.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError
from sqlmodel import Session
from typer.testing import CliRunner

from governance_loop import store
from governance_loop.cli import governance_app
from governance_loop.environments import (
    ContractDocument,
    diff_versions,
    register_environment_version,
    retire_environment_version,
)
from governance_loop.evalsets import EvalSetError, create_eval_set, set_threshold
from governance_loop.gates import ThresholdSpecError
from tests.factories import make_checkpoint, make_eval_set, make_task, uid
from tests.factories_governance import TEST_SPEC
from triloop.config import Settings, get_settings
from triloop.models import EvalItem, Threshold
from triloop.policy import Actor, Authorizer, PolicyDenied, Resource
from triloop.wiring import build_authorizer

pytestmark = pytest.mark.integration

CONTRACT: dict[str, Any] = {
    "task": "frozen_lake", "observations": ["grid"], "allowed_actions": ["left", "right"],
    "success_criteria": {"goal_reached": True}, "reward": {"outcome": {"success": 1.0}},
}


@pytest.fixture(scope="module")
def authorizer(settings: Settings) -> Authorizer:
    """Governance's authorizer."""
    return build_authorizer(settings, "governance")


@pytest.fixture(scope="module")
def gov(role_engine: Any) -> Engine:
    """The governance role's engine."""
    engine: Engine = role_engine("governance")
    return engine


def _document(name: str, contract: dict[str, Any]) -> ContractDocument:
    canonical = json.dumps({"contract": contract, "fixtures": {}}, sort_keys=True,
                           separators=(",", ":"))
    return ContractDocument(name=name, contract=contract, contract_text=json.dumps(contract),
                            fixture_hashes={},
                            version_id=hashlib.sha256(canonical.encode()).hexdigest())


def test_versions_are_content_addressed_and_numbered_per_environment(
    gov: Engine, authorizer: Authorizer
) -> None:
    name, other = uid("lake-"), uid("pond-")
    contract = {**CONTRACT, "initial_state": {"size": uid()}}
    first = register_environment_version(engine=gov, authorizer=authorizer,
                                         document=_document(name, contract), requested_by="g")
    again = register_environment_version(engine=gov, authorizer=authorizer,
                                         document=_document(name, contract), requested_by="g")
    changed = {**contract, "allowed_actions": ["left", "right", "up"]}
    second = register_environment_version(engine=gov, authorizer=authorizer,
                                          document=_document(name, changed), requested_by="g")
    elsewhere = register_environment_version(
        engine=gov, authorizer=authorizer,
        document=_document(other, {**changed, "description": "x"}), requested_by="g")
    assert first.created and not again.created and again.id == first.id
    assert (first.version, second.version, elsewhere.version) == (1, 2, 1)
    changes = diff_versions(engine=gov, a=f"{name}@1", b=name)
    assert [(c.path, c.kind.value) for c in changes] == [("allowed_actions[2]", "added")]
    retired = retire_environment_version(engine=gov, authorizer=authorizer,
                                         version_id=first.id, requested_by="g")
    assert retired.retired
    # Retired, not rewritten: the version is still there for the lineage of old runs.
    with Session(gov) as session:
        row = store.get_environment_version(session=session, version_id=first.id)
        assert row.contract == contract and row.retired_by == "g"


def test_eval_sets_take_admitted_tasks_and_freeze(
    gov: Engine, authorizer: Authorizer, owner_engine: Engine
) -> None:
    admitted = [make_task(owner_engine), make_task(owner_engine)]
    pending = make_task(owner_engine, status="pending")
    name = uid("holdout-")
    for tasks, why in [([*admitted, pending], "only admitted tasks"),
                       ([admitted[0], admitted[0]], "more than once"), ([], "at least one")]:
        with pytest.raises(EvalSetError, match=why):
            create_eval_set(engine=gov, authorizer=authorizer, name=name, task_ids=tasks,
                            requested_by="g")
    v1 = create_eval_set(engine=gov, authorizer=authorizer, name=name, task_ids=admitted,
                         requested_by="g")
    v2 = create_eval_set(engine=gov, authorizer=authorizer, name=name,
                         task_ids=list(reversed(admitted)), requested_by="g")
    assert (v1.version, v2.version) == (1, 2)
    assert v1.content_hash and v2.content_hash and v1.content_hash != v2.content_hash
    # Frozen means frozen, even for governance: a change is a new version.
    with pytest.raises((ProgrammingError, DBAPIError), match="frozen"), \
            Session(gov) as session:
        session.add(EvalItem(eval_set_id=v1.id, ordinal=9, task_id=admitted[0]))
        session.commit()


def test_thresholds_are_versioned_validated_and_tied_to_frozen_sets(
    gov: Engine, authorizer: Authorizer, owner_engine: Engine
) -> None:
    eval_set = create_eval_set(engine=gov, authorizer=authorizer, name=uid("es-"),
                               task_ids=[make_task(owner_engine)], requested_by="g")
    name = uid("bar-")
    t1 = set_threshold(engine=gov, authorizer=authorizer, name=name,
                       spec={**TEST_SPEC, "version": "ignored"}, eval_set=eval_set.name,
                       requested_by="g")
    t2 = set_threshold(engine=gov, authorizer=authorizer, name=name, spec=TEST_SPEC,
                       eval_set=eval_set.id, requested_by="g")
    assert (t1.spec["version"], t2.spec["version"]) == (f"{name}@v1", f"{name}@v2")
    assert t1.eval_set_id == eval_set.id
    with Session(gov) as session:
        assert store.latest_threshold(session=session, name=name).id == t2.id  # type: ignore[union-attr]
    with pytest.raises(ThresholdSpecError, match="unknown fields"):
        set_threshold(engine=gov, authorizer=authorizer, name=name,
                      spec={**TEST_SPEC, "min_sucess_rate": 1}, eval_set=eval_set.id,
                      requested_by="g")
    with pytest.raises(EvalSetError, match="frozen"):
        set_threshold(engine=gov, authorizer=authorizer, name=name, spec=TEST_SPEC,
                      eval_set=make_eval_set(owner_engine), requested_by="g")


LEARNING_WRITES = [
    ("create", Resource("threshold")), ("update", Resource("threshold", id="t")),
    ("create", Resource("eval_item")), ("update", Resource("eval_item", id="i")),
    ("route", Resource("routing", id="canary")), ("update", Resource("routing", id="production")),
    ("update", Resource("deployment", id="production")),
    ("rollback", Resource("deployment", id="production")),
]


@pytest.mark.parametrize(("action", "resource"), LEARNING_WRITES)
def test_learning_identity_is_refused_by_opa(settings: Settings, action: str,
                                             resource: Resource) -> None:
    learning = build_authorizer(settings, "learning")
    with pytest.raises(PolicyDenied, match="learning loop may never"):
        learning.authorize(Actor(service="learning"), action, resource)


def test_learning_role_is_refused_by_the_database(
    role_engine: Any, owner_engine: Engine
) -> None:
    learning: Engine = role_engine("learning")
    checkpoint = make_checkpoint(owner_engine)
    task = make_task(owner_engine)
    attempts: list[Callable[[Session], Any]] = [
        lambda s: s.add(Threshold(name=uid(), version=1, spec=TEST_SPEC, created_by="l")),
        lambda s: s.add(EvalItem(eval_set_id=make_eval_set(owner_engine), ordinal=0,
                                 task_id=task)),
        lambda s: store.set_routing(session=s, slot="canary", checkpoint_id=checkpoint,
                                    share=1.0, promotion_id=None, updated_by="learning"),
        lambda s: store.move_alias(session=s, alias="production", checkpoint_id=checkpoint,
                                   rollback_target_id=None, promotion_id=None,
                                   actor="learning", reason="sneaky", kind="promote"),
    ]
    for attempt in attempts:
        with pytest.raises((ProgrammingError, DBAPIError), match="permission denied"), \
                Session(learning) as session:
            attempt(session)
            session.commit()


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[None]:
    """The CLI's settings point at the test services."""
    monkeypatch.setenv("TRILOOP_DATABASE_URL", settings.owner_url())
    monkeypatch.setenv("TRILOOP_SECRETS_DIR", str(settings.secrets))
    monkeypatch.setenv("TRILOOP_OPA_URL", settings.opa_url)
    monkeypatch.setenv("TRILOOP_TEMPORAL_ADDRESS", settings.temporal_address)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_cli_bootstraps_production(cli_env: None, owner_engine: Engine) -> None:
    # Eval sets and thresholds go through the API with the operator's token
    # (tests/integration/test_api_governance_writes.py).
    runner = CliRunner()
    checkpoint = make_checkpoint(owner_engine)
    moved = runner.invoke(governance_app, ["bootstrap-production", checkpoint, "--replace"])
    assert moved.exit_code == 0, moved.output
    refused = runner.invoke(governance_app, ["bootstrap-production", make_checkpoint(owner_engine)])
    assert refused.exit_code == 1 and "promote a candidate instead" in refused.output
    with owner_engine.connect() as conn:
        production = conn.execute(text(
            "SELECT d.checkpoint_id, r.checkpoint_id FROM deployment d, routing r "
            "WHERE d.alias = 'production' AND r.slot = 'production'")).one()
        # No person is claimed on the command line: the OS account is recorded as a label.
        audited = conn.execute(text(
            "SELECT count(*) FROM audit_event WHERE action IN ('create', 'update') AND "
            "resource->>'kind' = 'deployment' AND "
            "payload->'context'->'requested_by'->>'user' = :who"),
            {"who": f"{getpass.getuser()}@{socket.gethostname()}"}).scalar_one()
    assert tuple(production) == (checkpoint, checkpoint)
    assert audited >= 1


def test_cli_diffs_and_retires_registered_versions(
    cli_env: None, tmp_path: Path, gov: Engine, authorizer: Authorizer
) -> None:
    # Registering goes through the API (tests/integration/test_api_governance_writes.py);
    # diff and retire stay server-side commands.
    from governance_loop.environments import document_from_file
    from triloop.devstack.servers import repo_root

    source = repo_root() / "execution_loop" / "environments" / "contracts" / "frozen_lake.yaml"
    marker = uid()
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    base = source.read_text().replace("version: \"1\"", f"version: \"{marker}\"")
    first.write_text(base)
    second.write_text(base.replace("holes: 3", "holes: 4"))
    name = uid("lake-")
    runner = CliRunner()
    registered = [register_environment_version(
        engine=gov, authorizer=authorizer, document=document_from_file(path, name=name),
        requested_by="tester") for path in (first, second)]
    assert [r.version for r in registered] == [1, 2]
    diff = runner.invoke(governance_app, ["env", "diff", f"{name}@1", f"{name}@2"])
    assert diff.exit_code == 0 and "~ initial_state.holes: 3 -> 4" in diff.output
    file_diff = runner.invoke(governance_app, ["env", "diff", str(first), f"{name}@1"])
    assert file_diff.output.strip() == "no changes"
    version_id = registered[0].id
    retired = runner.invoke(governance_app, ["env", "retire", version_id])
    assert retired.exit_code == 0 and "retired" in retired.output
    missing = runner.invoke(governance_app, ["env", "diff", f"{name}@7", name])
    assert missing.exit_code == 1 and "no environment version" in missing.output
