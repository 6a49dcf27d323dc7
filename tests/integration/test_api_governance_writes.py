"""People register environment versions, freeze eval sets and set thresholds through the API.

The real path: the web app (OPA for the person, the contract checked, a ``human_decision``
recorded by the web role), Temporal, and the real governance worker, which proves the
decision, asks OPA again acting for the person and registers the version. Refusals leave
no decision and no version behind.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import typer
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Replayer
from typer.testing import CliRunner, Result

from governance_loop.worker import build_worker
from governance_loop.workflows import GovernanceWriteWorkflow
from tests.factories import make_task, uid
from tests.factories_governance import TEST_SPEC
from tests.factories_web import Person, admitted_task, assert_problem
from triloop.config import Settings
from triloop.temporal import DATA_CONVERTER, connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    GOVERNANCE_QUEUE,
    GOVERNANCE_WRITE_WORKFLOW,
    GovernanceWriteInput,
    governance_write_workflow_id,
)

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

RECORDED = Path(__file__).parents[1] / "workflows" / "histories" / "governance_write.json"
FROZEN_LAKE = Path(__file__).parents[2] / "execution_loop/environments/contracts/frozen_lake.yaml"


def contract(note: str, *, fixtures: list[str] | None = None) -> str:
    """The built-in frozen lake contract made unique by its description."""
    text_ = FROZEN_LAKE.read_text(encoding="utf-8").replace(
        "Seeded 4x4 frozen lake", f"Seeded 4x4 frozen lake ({note})")
    if fixtures:
        text_ += "fixtures:\n" + "".join(f"  - {f}\n" for f in fixtures)
    return text_


@pytest_asyncio.fixture(loop_scope="session")
async def governance(web_settings: Settings, role_engine: Any) -> AsyncIterator[Client]:
    """The real governance worker on the web tests' queues."""
    client = await connect(web_settings, identity="test-governance-worker", service="governance")
    worker = build_worker(client, web_settings, engine=role_engine("governance"),
                          authorizer=build_authorizer(web_settings, "governance"))
    async with worker:
        yield client


async def _replays(client: Client, workflow_id: str) -> None:
    """The workflow replays its own history; TRILOOP_RECORD_HISTORIES keeps it for
    tests/workflows/test_governance_replay.py."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(workflows=[GovernanceWriteWorkflow], data_converter=DATA_CONVERTER)
    await replayer.replay_workflow(history)
    if os.environ.get("TRILOOP_RECORD_HISTORIES"):
        RECORDED.write_text(json.dumps({"workflow_id": history.workflow_id,
                                        "history": json.loads(history.to_json())}))


def _rows(engine: Engine, name: str) -> tuple[int, int]:
    """(human_decision rows about ``name``, environment_version rows of ``name``)."""
    with engine.connect() as conn:
        decisions = conn.execute(text(
            "SELECT count(*) FROM human_decision WHERE kind = 'environment_version'"
            " AND subject = :n"), {"n": name}).scalar_one()
        versions = conn.execute(text(
            "SELECT count(*) FROM environment_version WHERE environment_name = :n"),
            {"n": name}).scalar_one()
        return int(decisions), int(versions)


async def test_an_operator_registers_a_version_through_the_api(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, governance: Client,
) -> None:
    operator, name = people["operator"], uid("lake-")
    body = {"name": name, "contract_yaml": contract(name, fixtures=["notes/map.txt"]),
            "fixtures": {"notes/map.txt": base64.b64encode(b"PFFF\nFOFO\n").decode()},
            "comment": "new lake"}
    response = await api.post("/api/environments", json=body, headers=operator.headers)
    assert response.status_code == 201, response.text
    registered = response.json()
    assert registered["environment"] == name and registered["version"] == 1
    assert registered["created"] is True
    with owner_engine.connect() as conn:
        row = conn.execute(text(
            "SELECT v.created_by, v.fixture_hashes, v.code_hashes, d.recorded_by, d.user_name"
            " FROM environment_version v JOIN human_decision d ON d.id = :d"
            " WHERE v.id = :v"), {"v": registered["version_id"],
                                  "d": registered["decision_id"]}).one()
        event = conn.execute(text(
            "SELECT actor, payload FROM audit_event WHERE action = 'register_environment_version'"
            " AND resource->>'id' = :v"), {"v": registered["version_id"]}).one()
    assert row.created_by == operator.name and row.user_name == operator.name
    assert row.recorded_by == "triloop_web"
    assert set(row.fixture_hashes) == {"notes/map.txt"} and row.code_hashes
    assert event.actor["service"] == "governance"
    assert event.payload["human_decision_id"] == registered["decision_id"]
    assert event.payload["requested_by"] == operator.name
    await _replays(governance, registered["workflow_id"])

    # Identical content again: the version that holds it, nothing new written.
    again = await api.post("/api/environments", json=body, headers=operator.headers)
    assert again.status_code == 200, again.text
    assert again.json()["version_id"] == registered["version_id"]
    assert again.json()["created"] is False
    assert _rows(owner_engine, name)[1] == 1

    # Changed content: the next version of the same environment.
    changed = {**body, "contract_yaml": contract(name + " v2", fixtures=["notes/map.txt"])}
    second = await api.post("/api/environments", json=changed, headers=operator.headers)
    assert second.status_code == 201 and second.json()["version"] == 2
    detail = (await api.get(f"/api/environments/{name}", headers=operator.headers)).json()
    assert detail["version_count"] == 2


async def test_a_bad_contract_is_refused_with_every_problem_and_nothing_recorded(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    name = uid("lake-")
    bad = contract(name).replace("max_turns: 10", "max_turns: -3").replace(
        "observations: [grid]", "observations: [grid]\nfavourite_colour: blue")
    response = await api.post("/api/environments", json={"name": name, "contract_yaml": bad},
                              headers=people["operator"].headers)
    problem = assert_problem(response, 422, "2 problem(s)", "limits.max_turns",
                             "favourite_colour")
    assert all(reason.startswith("line ") for reason in problem["reasons"])
    missing = await api.post("/api/environments", headers=people["operator"].headers, json={
        "name": name, "contract_yaml": contract(name, fixtures=["notes/map.txt"])})
    assert_problem(missing, 422, "notes/map.txt")
    escape = await api.post("/api/environments", headers=people["operator"].headers, json={
        "name": name, "contract_yaml": contract(name), "fixtures": {"../x": "eA=="}})
    assert_problem(escape, 422, "inside the contract's folder")
    assert _rows(owner_engine, name) == (0, 0)


async def test_only_operators_may_register(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    name = uid("lake-")
    for who in ("engineer", "auditor", "admin"):
        response = await api.post("/api/environments", headers=people[who].headers,
                                  json={"name": name, "contract_yaml": contract(name)})
        assert_problem(response, 403, "environment_version")
    assert _rows(owner_engine, name) == (0, 0)


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


async def test_env_register_sends_the_file_and_its_fixtures_with_the_persons_token(
    governance_cli: typer.Typer, people: dict[str, Person], tmp_path: Path, governance: Client,
) -> None:
    del governance
    name = uid("lake-")
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "a.txt").write_text("PFFF\n")
    (tmp_path / "maps" / "__pycache__").mkdir()
    (tmp_path / "maps" / "__pycache__" / "x.pyc").write_bytes(b"cache")
    good, bad = tmp_path / "lake.yaml", tmp_path / "bad.yaml"
    good.write_text(contract(name, fixtures=["maps"]))
    bad.write_text(contract(name).replace("max_turns: 10", "max_turns: -3"))
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(governance_cli, ["env", "register", *args, "--name", name])

    operator = people["operator"].token
    registered = await asyncio.to_thread(run, str(good), "--token", operator)
    assert registered.exit_code == 0, registered.output
    assert f"registered: {name} v1 " in registered.output
    again = await asyncio.to_thread(run, str(good), "--token", operator)
    assert f"already registered: {name} v1" in again.output
    refused = await asyncio.to_thread(run, str(bad), "--token", operator)
    assert refused.exit_code == 1 and f"{bad}: line " in refused.output
    assert "limits.max_turns" in refused.output and "422" in refused.output
    denied = await asyncio.to_thread(run, str(good), "--token", people["engineer"].token)
    assert denied.exit_code == 1 and "403" in denied.output
    no_token = await asyncio.to_thread(run, str(good))
    assert no_token.exit_code == 1 and "API token" in no_token.output


def _count(engine: Engine, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


async def test_an_operator_freezes_an_eval_set_and_sets_a_threshold(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, governance: Client,
) -> None:
    del governance
    operator, name, bar = people["operator"].headers, uid("holdout-"), uid("bar-")
    tasks = [admitted_task(owner_engine), admitted_task(owner_engine)]
    created = await api.post("/api/eval-sets", headers=operator,
                             json={"name": name, "task_ids": tasks, "comment": "q4 exam"})
    assert created.status_code == 201, created.text
    frozen = created.json()
    assert (frozen["name"], frozen["version"], frozen["task_ids"]) == (name, 1, tasks)
    assert frozen["content_hash"]
    with owner_engine.connect() as conn:
        row = conn.execute(text("SELECT created_by, frozen_at FROM eval_set WHERE id = :i"),
                           {"i": frozen["eval_set_id"]}).one()
        event = conn.execute(text(
            "SELECT payload FROM audit_event WHERE action = 'create_eval_set'"
            " AND resource->>'id' = :i"), {"i": frozen["eval_set_id"]}).one()
    assert row.created_by == people["operator"].name and row.frozen_at is not None
    assert event.payload["human_decision_id"] == frozen["decision_id"]

    stored = await api.post("/api/thresholds", headers=operator,
                            json={"name": bar, "eval_set": name, "spec": TEST_SPEC})
    assert stored.status_code == 201, stored.text
    threshold = stored.json()
    assert threshold["version"] == 1 and threshold["eval_set_id"] == frozen["eval_set_id"]
    assert threshold["spec"]["version"] == f"{bar}@v1"
    assert threshold["spec"]["min_success_rate"] == TEST_SPEC["min_success_rate"]
    second = await api.post("/api/thresholds", headers=operator, json={
        "name": bar, "eval_set": frozen["eval_set_id"], "spec": TEST_SPEC})
    assert second.status_code == 201 and second.json()["version"] == 2


async def test_eval_set_and_threshold_refusals_write_nothing(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, governance: Client,
) -> None:
    del governance
    operator, name, bar = people["operator"].headers, uid("holdout-"), uid("bar-")
    admitted, pending = admitted_task(owner_engine), make_task(owner_engine, status="pending")
    decisions_about = ("SELECT count(*) FROM human_decision WHERE subject = :s")
    not_admitted = await api.post("/api/eval-sets", headers=operator,
                                  json={"name": name, "task_ids": [admitted, pending]})
    assert_problem(not_admitted, 422, f"{pending}: task is pending, not admitted")
    twice = await api.post("/api/eval-sets", headers=operator,
                           json={"name": name, "task_ids": [admitted, admitted]})
    assert_problem(twice, 422, "listed more than once")
    for who in ("engineer", "auditor", "admin"):
        assert_problem(await api.post("/api/eval-sets", headers=people[who].headers,
                                      json={"name": name, "task_ids": [admitted]}), 403)
        assert_problem(await api.post("/api/thresholds", headers=people[who].headers, json={
            "name": bar, "eval_set": name, "spec": TEST_SPEC}), 403, "threshold")
    assert _count(owner_engine, decisions_about, s=name) == 0
    assert _count(owner_engine, "SELECT count(*) FROM eval_set WHERE name = :n", n=name) == 0

    # Only governance knows a threshold spec and which eval sets are frozen: it refuses (422),
    # the operator's decision stays on record, and no threshold is written.
    no_set = await api.post("/api/thresholds", headers=operator,
                            json={"name": bar, "eval_set": name, "spec": TEST_SPEC})
    assert_problem(no_set, 422, "no frozen eval set")
    made = await api.post("/api/eval-sets", headers=operator,
                          json={"name": name, "task_ids": [admitted]})
    assert made.status_code == 201, made.text
    bad_spec = await api.post("/api/thresholds", headers=operator,
                              json={"name": bar, "eval_set": name, "spec": {}})
    assert_problem(bad_spec, 422, "incomplete threshold spec")
    assert _count(owner_engine, "SELECT count(*) FROM threshold WHERE name = :n", n=bar) == 0
    assert _count(owner_engine, decisions_about, s=bar) == 2


async def test_eval_set_and_threshold_commands_call_the_api(
    governance_cli: typer.Typer, people: dict[str, Person], owner_engine: Engine,
    governance: Client,
) -> None:
    del governance
    runner, name, bar = CliRunner(), uid("cli-es-"), uid("cli-bar-")
    tasks = [admitted_task(owner_engine), admitted_task(owner_engine)]
    token = people["operator"].token

    def run(*args: str) -> Result:
        return runner.invoke(governance_cli, list(args))

    created = await asyncio.to_thread(run, "eval-set", "create", name, "--task", tasks[0],
                                      "--task", tasks[1], "--token", token)
    assert created.exit_code == 0 and f"{name} v1 " in created.output, created.output
    done = await asyncio.to_thread(run, "threshold", "set", bar, "--spec", json.dumps(TEST_SPEC),
                                   "--eval-set", name, "--token", token)
    assert done.exit_code == 0 and f"{bar} v1 " in done.output, done.output
    bad = await asyncio.to_thread(run, "threshold", "set", bar, "--spec", "{}",
                                  "--eval-set", name, "--token", token)
    assert bad.exit_code == 1 and "incomplete threshold spec" in bad.output
    denied = await asyncio.to_thread(run, "eval-set", "create", name, "--task", tasks[0],
                                     "--token", people["engineer"].token)
    assert denied.exit_code == 1 and "403" in denied.output


async def test_governance_acts_only_on_decisions_the_web_service_recorded(
    web_settings: Settings, owner_engine: Engine, people: dict[str, Person], governance: Client,
) -> None:
    name = uid("lake-")
    with owner_engine.begin() as conn:  # a row some other role wrote: no proof of a person
        forged = conn.execute(text(
            "INSERT INTO human_decision (id, kind, subject, decision, user_name, details)"
            " VALUES (:i, 'environment_version', :s, 'register', :u, CAST(:d AS jsonb))"
            " RETURNING id"), {"i": uid("forged-"), "s": name, "u": people["operator"].name,
                               "d": json.dumps({"contract_yaml": contract(name)})}).scalar_one()
    with pytest.raises(WorkflowFailureError) as failed:
        await governance.execute_workflow(
            GOVERNANCE_WRITE_WORKFLOW,
            GovernanceWriteInput(decision_id=forged, kind="environment_version", subject=name),
            id=governance_write_workflow_id(forged),
            task_queue=web_settings.task_queue(GOVERNANCE_QUEUE))
    assert "not by the web service" in str(failed.value.cause.cause)
    assert _rows(owner_engine, name)[1] == 0
    refusals = _count(owner_engine, "SELECT count(*) FROM audit_event WHERE decision = 'deny'"
                      " AND payload->>'human_decision_id' = :i", i=forged)
    assert refusals == 1


async def test_a_served_contract_whose_service_does_not_match_is_refused_by_governance(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, governance: Client,
    tmp_path: Path,
) -> None:
    from tests.environment_services import free_port, reference_service, write_contract

    operator, name = people["operator"], uid("served-")
    with reference_service() as url:
        for where, digest, expected in (
            (url, "0" * 64, "the contract pins " + "0" * 64),
            (f"http://127.0.0.1:{free_port()}", None, "is unreachable"),
        ):
            served = write_contract(tmp_path, where, digest=digest).read_text()
            response = await api.post("/api/environments", headers=operator.headers, json={
                "name": name, "contract_yaml": served})
            assert_problem(response, 422, "does not match its contract", expected, where)
        assert _rows(owner_engine, name)[1] == 0  # the decisions are on record; no version
        good = write_contract(tmp_path, url).read_text()
        response = await api.post("/api/environments", headers=operator.headers, json={
            "name": name, "contract_yaml": good})
        assert response.status_code == 201, response.text


async def test_a_threshold_names_eval_sets_per_environment(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, governance: Client,
    governance_cli: typer.Typer,
) -> None:
    operator, name, bar = people["operator"].headers, uid("holdout-"), uid("bar-")
    task = admitted_task(owner_engine)
    other = admitted_task(owner_engine)
    with owner_engine.connect() as conn:
        env, other_env = (conn.execute(text(
            "SELECT v.environment_name FROM task t JOIN environment_version v"
            " ON v.id = t.environment_version_id WHERE t.id = :t"), {"t": t}).scalar_one()
            for t in (task, other))
    made = await api.post("/api/eval-sets", headers=operator,
                          json={"name": name, "task_ids": [task]})
    assert made.status_code == 201, made.text
    eval_set_id = made.json()["eval_set_id"]

    stored = await api.post("/api/thresholds", headers=operator, json={
        "name": bar, "eval_sets": {env: [name]}, "spec": TEST_SPEC})
    assert stored.status_code == 201, stored.text
    assert stored.json()["eval_sets"] == {env: [eval_set_id]}
    assert stored.json()["eval_set_id"] is None
    with owner_engine.connect() as conn:
        row = conn.execute(text("SELECT eval_sets FROM threshold WHERE id = :i"),
                           {"i": stored.json()["threshold_id"]}).one()
    assert row.eval_sets == {env: [eval_set_id]}

    # Another environment's eval set, or none at all, is refused; nothing is written.
    wrong = await api.post("/api/thresholds", headers=operator, json={
        "name": bar, "eval_sets": {other_env: [name]}, "spec": TEST_SPEC})
    assert_problem(wrong, 422, f"not of '{other_env}'", "holds task")
    nothing = await api.post("/api/thresholds", headers=operator,
                             json={"name": bar, "spec": TEST_SPEC})
    assert_problem(nothing, 422, "names no eval set")
    assert _count(owner_engine, "SELECT count(*) FROM threshold WHERE name = :n", n=bar) == 1

    def run(*args: str) -> Result:
        return CliRunner().invoke(governance_cli, list(args))

    result = await asyncio.to_thread(
        run, "threshold", "set", bar, "--spec", json.dumps(TEST_SPEC), "--eval-set-for",
        f"{env}={name}", "--token", people["operator"].token)
    assert result.exit_code == 0, result.output
    assert f"{env}={eval_set_id}" in result.output and f"{bar} v2" in result.output
    bad = await asyncio.to_thread(run, "threshold", "set", bar, "--spec", "{}",
                                  "--token", people["operator"].token)
    assert bad.exit_code != 0 and "name an eval set" in bad.output
