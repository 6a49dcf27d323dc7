"""An operator registers task sets from seeds and datasets through the API (issue 26).

The real path: the web app (OPA for the person, the source checked, a dataset put in the
artifact store, a ``human_decision``), Temporal, the real governance worker
(``TaskSetRegistration``) and, through Nexus, the execution loop's real ``describe_tasks``,
which describes each task with the environment's own ``describe``. The set's admission
(another part's workflow) is a stand-in here that records which set it was started for.
Every refusal leaves no task set, member or new task behind.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import Engine, text
from temporalio.client import Client
from temporalio.worker import Worker

from execution_loop.serving import TaskEnvironments
from execution_loop.task_description import TaskDescriber
from execution_loop.workflows import DescribeTasksWorkflow
from governance_loop.worker import build_worker
from tests.factories import uid
from tests.factories_web import Person, assert_problem
from tests.temporal_helpers import execution_nexus, loop_client, provision_endpoints
from triloop.artifact_backends import open_store
from triloop.config import Settings
from triloop.db import role_engine as open_role_engine
from triloop.temporal import DATA_CONVERTER, connect
from triloop.wiring import build_authorizer
from triloop.workflow_api import (
    EXECUTION_QUEUE,
    GOVERNANCE_QUEUE,
    TASK_SET_ADMISSION_WORKFLOW,
    TaskSetAdmissionInput,
    task_set_admission_workflow_id,
)

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def loops(web_settings: Settings, role_engine: Any) -> AsyncIterator[Client]:
    """Governance's real worker and execution's real describe_tasks behind its Nexus
    handler, on the web tests' queues."""
    provision_endpoints(web_settings)
    client = await connect(web_settings, identity="test-governance-worker", service="governance")
    governance = build_worker(client, web_settings, engine=role_engine("governance"),
                              authorizer=build_authorizer(web_settings, "governance"))
    execution = await loop_client(web_settings, "execution", "execution-describer")
    describer = TaskDescriber(
        environments=TaskEnvironments(engine=open_role_engine(web_settings, "execution")),
        store=open_store(web_settings))
    described = Worker(execution, task_queue=web_settings.task_queue(EXECUTION_QUEUE),
                       workflows=[DescribeTasksWorkflow], activities=[describer.describe_tasks],
                       activity_executor=ThreadPoolExecutor(2),
                       nexus_service_handlers=[execution_nexus(web_settings)])
    async with governance, described:
        yield client


def _frozen_lake(owner: Engine) -> str:
    """A version of a fresh environment on the shipped frozen_lake contract: NAME@1."""
    from execution_loop.environments.registry import builtin_contract_path

    name = uid("lake-")
    contract_text = builtin_contract_path("frozen_lake").read_text()
    with owner.begin() as conn:
        conn.execute(text("INSERT INTO environment (name, description, created_by) "
                          "VALUES (:n, '', 'test')"), {"n": name})
        conn.execute(text(
            "INSERT INTO environment_version (id, environment_name, version, contract, "
            "contract_text, fixture_hashes, created_by) VALUES (:i, :n, 1, "
            "'{\"task\": \"frozen_lake\"}', :t, '{}', 'test')"),
            {"i": uid("sha-"), "n": name, "t": contract_text})
    return f"{name}@1"


def _written(owner: Engine, name: str, version_ref: str) -> tuple[int, int, int]:
    """(task sets named ``name``, their members, tasks on the version)."""
    environment = version_ref.partition("@")[0]
    with owner.connect() as conn:
        sets = conn.execute(text("SELECT count(*) FROM task_set WHERE name = :n"),
                            {"n": name}).scalar_one()
        members = conn.execute(text(
            "SELECT count(*) FROM task_set_member m JOIN task_set s ON s.id = m.task_set_id "
            "WHERE s.name = :n"), {"n": name}).scalar_one()
        tasks = conn.execute(text(
            "SELECT count(*) FROM task t JOIN environment_version v "
            "ON v.id = t.environment_version_id WHERE v.environment_name = :e"),
            {"e": environment}).scalar_one()
    return int(sets), int(members), int(tasks)


def _jsonl(rows: list[dict[str, Any]], name: str = "items.jsonl") -> dict[str, str]:
    data = "\n".join(json.dumps(r) for r in rows).encode()
    return {"filename": name, "content_base64": base64.b64encode(data).decode()}


async def _admission_started(client: Client, task_set_id: str) -> None:
    """The set's admission was started, under its id, with the set's id, on governance's
    queue (the workflow itself is another part's; here only its start is checked)."""
    handle = client.get_workflow_handle(task_set_admission_workflow_id(task_set_id))
    described = await handle.describe()
    assert described.workflow_type == TASK_SET_ADMISSION_WORKFLOW
    assert described.task_queue.endswith(GOVERNANCE_QUEUE)
    history = await handle.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    (payload,) = await DATA_CONVERTER.decode(started.input.payloads, [TaskSetAdmissionInput])
    assert payload == TaskSetAdmissionInput(task_set_id=task_set_id)


async def test_an_operator_registers_seeds_split_by_list_and_its_admission_starts(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, loops: Client,
) -> None:
    version, name = _frozen_lake(owner_engine), uid("lakes-")
    body = {"name": name, "environment": version, "seeds": [1, 2, 3, 4, 5],
            "split": {"by": "list", "eval": [3], "traffic": [4]},
            "tags": {"domain": "navigation"}}
    response = await api.post("/api/task-sets", json=body, headers=people["operator"].headers)
    assert response.status_code == 201, response.text
    stored = response.json()
    assert stored["version"] == 1 and stored["created"] is True and stored["new_tasks"] == 5
    assert stored["splits"] == {"train": 3, "eval": 1, "traffic": 1}
    await _admission_started(loops, stored["task_set_id"])
    with owner_engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT m.ordinal, m.split, t.seed, t.content_digest, t.tags, t.status "
            "FROM task_set_member m JOIN task t ON t.id = m.task_id "
            "WHERE m.task_set_id = :s ORDER BY m.ordinal"), {"s": stored["task_set_id"]}).all()
        event = conn.execute(text(
            "SELECT payload FROM audit_event WHERE action = 'register_task_set' "
            "AND resource->>'id' = :s"), {"s": stored["task_set_id"]}).scalar_one()
    from execution_loop.environments.registry import describe_task, load_builtin_contract

    contract = load_builtin_contract("frozen_lake")
    assert [(r.ordinal, r.split, r.seed) for r in rows] == [
        (0, "train", 1), (1, "train", 2), (2, "train", 3), (3, "eval", 4), (4, "traffic", 5)]
    assert [r.content_digest for r in rows] == [describe_task(contract, s).digest
                                                for s in range(1, 6)]
    assert rows[0].tags == {"domain": "navigation", "size": "4", "holes": "3"}
    assert {r.status for r in rows} == {"pending"}
    assert event["requested_by"] == people["operator"].name
    assert event["human_decision_id"] == stored["decision_id"]

    again = await api.post("/api/task-sets", json=body, headers=people["operator"].headers)
    assert again.status_code == 200 and again.json()["task_set_id"] == stored["task_set_id"]
    # Another rule over the same seeds is the next version, and reuses the same tasks.
    other = await api.post("/api/task-sets", headers=people["operator"].headers, json={
        **body, "split": {"by": "fraction", "train": 0.6, "eval": 0.2, "traffic": 0.2}})
    assert other.status_code == 201, other.text
    assert other.json()["version"] == 2 and other.json()["new_tasks"] == 0
    assert _written(owner_engine, name, version) == (2, 10, 5)

    listed = (await api.get(f"/api/task-sets?name={name}&limit=1",
                            headers=people["engineer"].headers)).json()
    assert [s["version"] for s in listed["items"]] == [2] and listed["next_cursor"]
    shown = await api.get(f"/api/task-sets/{name}@1", headers=people["engineer"].headers)
    assert shown.status_code == 200, shown.text
    assert shown.json()["splits"] == {"train": 3, "eval": 1, "traffic": 1}
    assert shown.json()["members"][3]["split"] == "eval"
    by_prefix = await api.get(f"/api/task-sets/{stored['task_set_id'][:10]}",
                              headers=people["engineer"].headers)
    assert by_prefix.json()["id"] == stored["task_set_id"]


async def test_a_dataset_with_one_item_in_two_splits_is_refused_naming_the_ordinals(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, loops: Client,
) -> None:
    del loops
    version, name = _frozen_lake(owner_engine), uid("lakes-")
    # frozen_lake takes no item: the dataset's rows are refused by the environment itself
    rows = [{"question": "a", "split": "train"}, {"question": "b", "split": "eval"}]
    refused = await api.post("/api/task-sets", headers=people["operator"].headers, json={
        "name": name, "environment": version, "dataset": _jsonl(rows),
        "split": {"by": "field", "field": "split"}})
    assert_problem(refused, 422, "task 0 (seed 0)", "frozen_lake takes no item")
    # Seeds 43 and 190 draw one map: the same task in train and eval.
    twins = await api.post("/api/task-sets", headers=people["operator"].headers, json={
        "name": name, "environment": version, "seeds": [43, 7, 190],
        "split": {"by": "list", "eval": [2]}})
    assert_problem(twins, 422, "tasks 0, 2 have one content digest", "splits train, eval")
    assert _written(owner_engine, name, version) == (0, 0, 0)


async def test_a_dataset_duplicated_across_splits_is_refused(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, loops: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An environment that plays items (its observation is the question): the same
    question in train and eval is one item, and the set is refused naming both rows."""
    del loops
    from execution_loop.environments import registry
    from tests.unit.test_task_content import _Echo

    base = registry._BUILTINS["tool_arithmetic"]
    monkeypatch.setitem(registry._BUILTINS, "tool_arithmetic", registry._Builtin(
        _Echo, base.capabilities, base.reference))
    contract = registry.builtin_contract_path("tool_arithmetic").read_text()
    environment = uid("echo-")
    with owner_engine.begin() as conn:
        conn.execute(text("INSERT INTO environment (name, description, created_by) "
                          "VALUES (:n, '', 'test')"), {"n": environment})
        conn.execute(text(
            "INSERT INTO environment_version (id, environment_name, version, contract, "
            "contract_text, fixture_hashes, created_by) VALUES (:i, :n, 1, '{}', :t, '{}', "
            "'test')"), {"i": uid("sha-"), "n": environment, "t": contract})
    rows = [{"question": "2+2", "split": "train"}, {"question": "3+3", "split": "train"},
            {"question": "2+2", "split": "eval"}]
    name = uid("echo-set-")
    refused = await api.post("/api/task-sets", headers=people["operator"].headers, json={
        "name": name, "environment": f"{environment}@1", "dataset": _jsonl(rows),
        "split": {"by": "field", "field": "split"}})
    assert_problem(refused, 422, "tasks 0, 2 have one content digest", "splits train, eval")
    assert _written(owner_engine, name, f"{environment}@1") == (0, 0, 0)
    rows[2]["question"] = "4+4"
    stored = await api.post("/api/task-sets", headers=people["operator"].headers, json={
        "name": name, "environment": f"{environment}@1", "dataset": _jsonl(rows),
        "split": {"by": "field", "field": "split"}})
    assert stored.status_code == 201, stored.text
    assert stored.json()["splits"] == {"train": 2, "eval": 1}
    with owner_engine.connect() as conn:
        items = conn.execute(text(
            "SELECT t.item FROM task_set_member m JOIN task t ON t.id = m.task_id "
            "WHERE m.task_set_id = :s ORDER BY m.ordinal"),
            {"s": stored.json()["task_set_id"]}).scalars().all()
    assert items == [{"question": "2+2"}, {"question": "3+3"}, {"question": "4+4"}]


async def test_refusals_leave_nothing_behind(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine, loops: Client,
) -> None:
    del loops
    version, name = _frozen_lake(owner_engine), uid("lakes-")
    seeds = {"name": name, "environment": version, "seeds": [1, 2],
             "split": {"by": "fraction", "train": 1.0}}
    for who in ("engineer", "auditor", "admin"):
        assert_problem(await api.post("/api/task-sets", json=seeds,
                                      headers=people[who].headers), 403, "task_set")
    malformed = await api.post("/api/task-sets", headers=people["operator"].headers, json={
        **seeds, "seeds": None, "dataset": {
            "filename": "rows.jsonl",
            "content_base64": base64.b64encode(b'{"q": 1}\n[1, 2]\n{oops\n').decode()}})
    assert_problem(malformed, 422, "line 2: a row must be a JSON object", "line 3: not JSON")
    unknown = await api.post("/api/task-sets", headers=people["operator"].headers,
                             json={**seeds, "environment": "no-such-env@3"})
    assert_problem(unknown, 422, "no environment version 'no-such-env@3'")
    generator = await api.post("/api/task-sets", headers=people["operator"].headers, json={
        **seeds, "seeds": None, "generator": {"count": 5}})
    assert_problem(generator, 422, "frozen_lake has no generator")
    bad_rule = await api.post("/api/task-sets", headers=people["operator"].headers, json={
        **seeds, "split": {"by": "fraction", "train": 0.5, "eval": 0.1}})
    assert_problem(bad_rule, 422, "the shares add up to 0.6")
    assert _written(owner_engine, name, version) == (0, 0, 0)


def test_a_parquet_dataset_reads_as_its_rows() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from triloop.task_sources import dataset_rows

    buffer = io.BytesIO()
    pq.write_table(pa.table({"question": ["1+1", "2+2"], "answer": [2, 4]}), buffer)
    assert dataset_rows(buffer.getvalue(), "parquet") == [
        {"question": "1+1", "answer": 2}, {"question": "2+2", "answer": 4}]


@pytest.fixture
def governance_cli(monkeypatch: pytest.MonkeyPatch, web_app: Any) -> Any:
    """``triloop governance``, its API calls answered by the test app in-process."""
    from fastapi.testclient import TestClient

    from governance_loop.cli import governance_app

    client = TestClient(web_app)

    def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("timeout", None)
        return client.request(method, url.replace("http://127.0.0.1:8000", ""), **kwargs)

    monkeypatch.setattr(httpx, "request", request)
    return governance_app


async def test_task_set_register_list_and_show_on_the_command_line(
    governance_cli: Any, people: dict[str, Person], owner_engine: Engine, loops: Client,
    tmp_path: Any,
) -> None:
    from typer.testing import CliRunner

    del loops
    version, name = _frozen_lake(owner_engine), uid("lakes-")
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(governance_cli, ["task-set", *args])

    register = ["register", "--environment", version, "--name", name, "--seeds", "1-3,9",
                "--split", '{"by": "list", "eval": [3]}', "--tag", "domain=navigation"]
    made = await asyncio.to_thread(run, *register, "--token", people["operator"].token)
    assert made.exit_code == 0, made.output
    assert f"registered: {name} v1 " in made.output and "eval 1, train 3" in made.output
    denied = await asyncio.to_thread(run, *register, "--token", people["engineer"].token)
    assert denied.exit_code == 1 and "403" in denied.output
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"q": 1}\n"not an object"\n')
    bad = await asyncio.to_thread(run, *register[:5], "--dataset", str(rows), "--split",
                                  '{"by": "fraction", "train": 1}', "--token",
                                  people["operator"].token)
    assert bad.exit_code == 1 and "line 2: a row must be a JSON object" in bad.output
    listed = await asyncio.to_thread(run, "list", "--name", name, "-o", "json", "--token",
                                     people["engineer"].token)
    assert listed.exit_code == 0, listed.output
    (only,) = json.loads(listed.output)["items"]
    assert only["splits"] == {"train": 3, "eval": 1} and only["tags"] == {"domain": "navigation"}
    shown = await asyncio.to_thread(run, "show", f"{name}@1", "--token", people["engineer"].token)
    assert shown.exit_code == 0, shown.output
    assert "train=3 eval=1" in shown.output and "seed 9" in shown.output
