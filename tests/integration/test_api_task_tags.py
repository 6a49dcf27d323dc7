"""Tasks with their environment, splits and tags: the listing's fields and filters (API,
CLI), task ids by unique prefix, a run's curriculum checked at submission, an eval set's
coverage per tag (API and console), and a run's per-tag rows in its API.

Tags and task-set memberships are written through the owner engine, as task-set
registration writes them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import pytest
import typer
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from tests.factories import insert, make_environment_version, make_run, uid
from tests.factories_web import Person, assert_problem
from tests.integration.console_client import console_session
from tests.integration.test_api_runs import learning_stand_in  # noqa: F401 (fixture)
from triloop.workflow_api import RUN_CANCEL_SIGNAL, RunControl

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]


def tag(engine: Engine, task_id: str, **tags: str) -> str:
    with engine.begin() as conn:
        conn.execute(text("UPDATE task SET tags = CAST(:t AS jsonb) WHERE id = :i"),
                     {"t": json.dumps(tags), "i": task_id})
    return task_id


def make_task_as(engine: Engine, task_id: str, version_id: str, seed: int,
                 status: str = "admitted", **tags: str) -> str:
    insert(engine, "task", id=task_id, environment_version_id=version_id, seed=seed,
           status=status, evidence={})
    return tag(engine, task_id, **tags)


def make_task_set(engine: Engine, version_id: str, splits: dict[str, str]) -> str:
    """A task set holding these tasks (task id -> split), their digests set as registration
    does; returns its name@version."""
    name = uid("set-")
    set_id = hashlib.sha256(name.encode()).hexdigest()
    insert(engine, "task_set", id=set_id, name=name, version=1, environment_version_id=version_id,
           source_kind="seeds", source={}, split_rule={}, created_by="test")
    for ordinal, (task_id, split) in enumerate(splits.items()):
        digest = hashlib.sha256(task_id.encode()).hexdigest()
        with engine.begin() as conn:
            conn.execute(text("UPDATE task SET content_digest = :d WHERE id = :i"),
                         {"d": digest, "i": task_id})
        insert(engine, "task_set_member", task_set_id=set_id, task_id=task_id, ordinal=ordinal,
               split=split, content_digest=digest)
    return f"{name}@1"


def environment_of(engine: Engine, version_id: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT environment_name FROM environment_version"
                                     " WHERE id = :v"), {"v": version_id}).scalar_one())


@pytest.fixture
def tagged(owner_engine: Engine) -> dict[str, Any]:
    """Four tasks of one fresh environment: two easy, one hard (pending), one untagged; the
    easy ones and the hard one in a task set's train, eval and traffic splits."""
    version = make_environment_version(owner_engine)
    axis = uid("axis")  # a tag key no other test's tasks carry
    ids = {name: make_task_as(owner_engine, uid(f"tt{n}-"), version, n, **tags)
           for n, (name, tags) in enumerate({
               "easy1": {axis: "easy", "domain": "grid"},
               "easy2": {axis: "easy", "domain": "math"},
               "hard": {axis: "hard", "domain": "math"},
               "plain": {}}.items())}
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE task SET status = 'pending' WHERE id = :i"), {"i": ids["hard"]})
    task_set = make_task_set(owner_engine, version, {ids["easy1"]: "train",
                                                     ids["easy2"]: "eval",
                                                     ids["hard"]: "traffic"})
    return {"ids": ids, "axis": axis, "version": version, "task_set": task_set,
            "environment": environment_of(owner_engine, version)}


async def listing(api: httpx.AsyncClient, person: Person, **query: Any) -> list[dict[str, Any]]:
    response = await api.get("/api/tasks", params=query, headers=person.headers)
    assert response.status_code == 200, response.text
    return list(response.json()["items"])


async def test_the_task_listing_shows_environment_splits_and_tags_and_filters_on_them(
    api: httpx.AsyncClient, people: dict[str, Person], tagged: dict[str, Any],
) -> None:
    ids, axis, reader = tagged["ids"], tagged["axis"], people["operator"]
    found = {t["id"]: t for t in await listing(api, reader, environment=tagged["environment"])}
    assert set(found) == set(ids.values())
    easy1 = found[ids["easy1"]]
    assert easy1["environment"] == tagged["environment"] and easy1["environment_version"] == 1
    assert easy1["tags"] == {axis: "easy", "domain": "grid"}
    assert [(m["task_set"], m["split"]) for m in easy1["splits"]] == [
        (tagged["task_set"], "train")]
    assert found[ids["plain"]]["tags"] == {} and found[ids["plain"]]["splits"] == []

    async def ids_of(**query: Any) -> set[str]:
        return {t["id"] for t in await listing(api, reader, environment=tagged["environment"],
                                               **query)}

    assert await ids_of(tag=f"{axis}=easy") == {ids["easy1"], ids["easy2"]}
    assert await ids_of(tag=[f"{axis}=easy", "domain=math"]) == {ids["easy2"]}
    assert await ids_of(tag=f"{axis}=medium") == set()
    assert await ids_of(split="eval") == {ids["easy2"]}
    assert await ids_of(split="traffic", status="pending") == {ids["hard"]}
    assert await ids_of(status="admitted", tag=f"{axis}=hard") == set()
    assert {t["id"] for t in await listing(api, reader, tag=f"{axis}=easy")} == {
        ids["easy1"], ids["easy2"]}  # a tag filter alone, across environments

    # Paginated: one page of one, then the next from its cursor.
    first = await api.get("/api/tasks", params={"environment": tagged["environment"],
                                                "limit": 3}, headers=reader.headers)
    page = first.json()
    assert len(page["items"]) == 3 and page["next_cursor"]
    rest = await listing(api, reader, environment=tagged["environment"], limit=3,
                         cursor=page["next_cursor"])
    assert {t["id"] for t in page["items"] + rest} == set(ids.values())

    bad = await api.get("/api/tasks", params={"tag": "difficulty"}, headers=reader.headers)
    assert_problem(bad, 422, "tag 'difficulty': expected key=value")
    wrong_split = await api.get("/api/tasks", params={"split": "test"}, headers=reader.headers)
    assert wrong_split.status_code == 422


async def test_task_ids_are_accepted_by_unique_prefix_and_an_ambiguous_one_names_candidates(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    version = make_environment_version(owner_engine)
    stem = uid("pfx")
    first = make_task_as(owner_engine, f"{stem}-a1", version, 1)
    second = make_task_as(owner_engine, f"{stem}-b2", version, 2)
    reader = people["operator"]

    shown = await api.get(f"/api/tasks/{stem}-a", headers=reader.headers)
    assert shown.status_code == 200, shown.text
    assert shown.json()["id"] == first
    exact = await api.get(f"/api/tasks/{second}", headers=reader.headers)
    assert exact.json()["id"] == second
    ambiguous = await api.get(f"/api/tasks/{stem}", headers=reader.headers)
    assert_problem(ambiguous, 422, "ambiguous", first, second)
    missing = await api.get(f"/api/tasks/{stem}-z", headers=reader.headers)
    assert_problem(missing, 404, f"{stem}-z")
    listed = await listing(api, reader, id_prefix=stem)
    assert {t["id"] for t in listed} == {first, second}

    # The admission decision resolves a prefix too: this one is already admitted.
    decided = await api.post(f"/api/tasks/{stem}-b/admission", headers=reader.headers,
                             json={"decision": "approve", "comment": "ok"})
    assert_problem(decided, 409, f"task {second} is already admitted")
    unsure = await api.post(f"/api/tasks/{stem}/admission", headers=reader.headers,
                            json={"decision": "approve", "comment": "ok"})
    assert_problem(unsure, 422, "ambiguous", first, second)


def _config(*task_ids: str, **rollout: Any) -> dict[str, Any]:
    return {"name": "tagged run", "model": {"base": "/models/tiny-local"},
            "rollout": {"task_ids": list(task_ids), "group_size": 2, **rollout}}


def _runs_named(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM training_run WHERE name = :n"),
                                {"n": name}).scalar_one())


async def test_a_run_names_tasks_by_prefix_and_its_curriculum_is_checked_at_submission(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    tagged: dict[str, Any], learning_stand_in: Any,  # noqa: F811 (the imported fixture)
) -> None:
    ids, axis, engineer = tagged["ids"], tagged["axis"], people["engineer"]
    easy1, easy2 = ids["easy1"], ids["easy2"]
    curriculum = [{"from_iteration": 1, "tags": {axis: ["easy"]}},
                  {"from_iteration": 3, "tags": {axis: ["easy"], "domain": ["math"]}}]
    config = _config(easy1[:-3], easy2, curriculum=curriculum)
    response = await api.post("/api/runs", json={"config": config}, headers=engineer.headers)
    assert response.status_code == 201, response.text
    run = response.json()
    with owner_engine.connect() as conn:
        stored = conn.execute(text("SELECT config FROM training_run WHERE id = :i"),
                              {"i": run["id"]}).scalar_one()
    assert stored["rollout"]["task_ids"] == [easy1, easy2]  # full ids, as the workers see them
    assert stored["rollout"]["curriculum"][1]["tags"] == {axis: ["easy"], "domain": ["math"]}
    handle = learning_stand_in.get_workflow_handle(run["workflow_id"])
    await handle.signal(RUN_CANCEL_SIGNAL, RunControl("test"))
    await handle.result()

    name = uid("refused-")
    for stages, needles in (
        ([{"from_iteration": 2, "tags": {"level": ["1"]}}],
         ("rollout.curriculum[0] (from iteration 2)", "tag key(s) ['level']")),
        ([{"from_iteration": 1, "tags": {axis: ["easy"]}},
          {"from_iteration": 4, "tags": {axis: ["easy"], "domain": ["space"]}}],
         ("rollout.curriculum[1] (from iteration 4)", "domain=space", "selects no task")),
        ([{"from_iteration": 4, "tags": {axis: ["easy"]}},
          {"from_iteration": 2, "tags": {axis: ["easy"]}}],
         ("rollout.curriculum", "increasing iterations")),
    ):
        refused = await api.post("/api/runs", headers=engineer.headers, json={
            "config": {**_config(easy1, easy2, curriculum=stages), "name": name}})
        assert_problem(refused, 422, *needles)
    # A prefix of several tasks' ids is refused, naming them.
    ambiguous = await api.post("/api/runs", headers=engineer.headers, json={
        "config": {**_config(easy1, "tt"), "name": name}})
    assert_problem(ambiguous, 422, "'tt' is ambiguous")
    assert _runs_named(owner_engine, name) == 0


async def test_an_eval_set_shows_its_coverage_per_tag_in_the_api_and_the_console(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
    tagged: dict[str, Any],
) -> None:
    ids, axis = tagged["ids"], tagged["axis"]
    eval_set = uid("es-")
    insert(owner_engine, "eval_set", id=eval_set, name=eval_set, version=1, created_by="gov")
    for ordinal, task in enumerate((ids["easy1"], ids["easy2"], ids["plain"])):
        insert(owner_engine, "eval_item", eval_set_id=eval_set, ordinal=ordinal, task_id=task)
    response = await api.get(f"/api/eval-sets/{eval_set}", headers=people["engineer"].headers)
    assert response.status_code == 200, response.text
    body = response.json()
    coverage = {c["tag"]: (c["tasks"], round(c["share"], 3)) for c in body["coverage"]}
    assert coverage == {f"{axis}=easy": (2, 0.667), "domain=grid": (1, 0.333),
                        "domain=math": (1, 0.333)}
    assert body["untagged"] == 1 and body["item_count"] == 3

    await console_session(api, people["engineer"])
    page = await api.get(f"/eval-sets/{eval_set}")
    assert page.status_code == 200, page.text
    assert "Coverage per tag" in page.text
    assert f'data-tag="{axis}=easy"' in page.text and "1 task carries no tag" in page.text
    listed = await api.get("/eval-sets")
    assert listed.status_code == 200 and f"/eval-sets/{eval_set}" in listed.text
    missing = await api.get("/eval-sets/no-such-set")
    assert missing.status_code == 404


async def test_a_run_api_shows_reward_and_success_per_tag(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine,
) -> None:
    run_id = make_run(owner_engine, submitted_by=people["engineer"].name)
    for iteration, series in ((1, {"reward/tag/difficulty=easy": 0.25,
                                   "success/tag/difficulty=easy": 0.5}),
                              (2, {"reward/tag/difficulty=hard": 0.75})):
        insert(owner_engine, "training_step", run_id=run_id, iteration=iteration,
               metrics={"series": series}, alarms=[])
    response = await api.get(f"/api/runs/{run_id}", headers=people["engineer"].headers)
    assert response.status_code == 200, response.text
    shown = _train_show_lines(response)
    assert response.json()["tags"] == [
        {"tag": "difficulty=easy", "key": "difficulty", "value": "easy", "reward": 0.25,
         "success": 0.5, "iteration": 1},
        {"tag": "difficulty=hard", "key": "difficulty", "value": "hard", "reward": 0.75,
         "success": None, "iteration": 2}]
    # `triloop train show` prints a line per tag value.
    assert shown == ["  tag difficulty=easy: reward=0.25 success=50% (iteration 1)",
                     "  tag difficulty=hard: reward=0.75 success=? (iteration 2)"]


def _train_show_lines(response: httpx.Response) -> list[str]:
    import contextlib
    import io

    from web import cli_runs

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cli_runs._show(response.json(), "http://127.0.0.1:8000")
    return [line for line in printed.getvalue().splitlines() if line.startswith("  tag ")]


@pytest.fixture
def governance_cli(monkeypatch: pytest.MonkeyPatch, web_app: FastAPI) -> typer.Typer:
    """``triloop governance``, its API calls answered by the test app in-process."""
    from governance_loop.cli import governance_app

    client = TestClient(web_app)

    def request(method: str, url: str, **kwargs: Any) -> Any:
        kwargs.pop("timeout", None)
        return client.request(method, url.replace("http://127.0.0.1:8000", ""), **kwargs)

    monkeypatch.setattr(httpx, "request", request)
    return governance_app


def test_governance_task_list_prints_environment_splits_and_tags_with_filters(
    governance_cli: typer.Typer, people: dict[str, Person], tagged: dict[str, Any],
) -> None:
    ids, axis, token = tagged["ids"], tagged["axis"], people["operator"].token
    runner = CliRunner()
    table = runner.invoke(governance_cli, ["task", "list", "--environment",
                                           tagged["environment"], "--token", token])
    assert table.exit_code == 0, table.output
    header, *lines = table.stdout.strip().splitlines()
    assert header.split("\t") == ["id", "environment", "seed", "status", "use", "splits",
                                   "tags"]
    row = next(line.split("\t") for line in lines if line.startswith(ids["easy1"]))
    assert row[1] == f"{tagged['environment']}@1" and row[3] == "admitted"
    assert row[4] == "training"
    assert row[5] == f"{tagged['task_set']}: train"
    assert row[6] == f"{axis}=easy, domain=grid"

    filtered = runner.invoke(governance_cli, [
        "task", "list", "--tag", f"{axis}=easy", "--tag", "domain=math", "--split", "eval",
        "--status", "admitted", "--json", "--token", token])
    assert filtered.exit_code == 0, filtered.output
    page = json.loads(filtered.stdout)
    assert [t["id"] for t in page["items"]] == [ids["easy2"]]
    assert page["items"][0]["splits"][0]["split"] == "eval"

    paged = runner.invoke(governance_cli, ["task", "list", "--environment",
                                           tagged["environment"], "--limit", "2",
                                           "--token", token])
    assert paged.exit_code == 0 and "more: triloop governance task list --cursor" in paged.stderr

    bad = runner.invoke(governance_cli, ["task", "list", "--tag", "oops", "--token", token])
    assert bad.exit_code == 1 and "expected key=value" in bad.output
    untokened = runner.invoke(governance_cli, ["task", "list"], env={"TRILOOP_TOKEN": ""})
    assert untokened.exit_code == 1 and "API token" in untokened.output

