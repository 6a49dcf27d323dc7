"""Environments, versions with contract diffs, tasks with admission evidence, eval sets."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import Engine

from tests.factories import insert, make_eval_set, make_task, uid
from tests.factories_web import Person, assert_problem

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.factories_web_fixtures"]

V1 = {"task": "sort", "allowed_actions": ["read", "swap", "done"], "reward": {"success": 1.0}}
V2 = {"task": "sort", "allowed_actions": ["read", "done"], "reward": {"success": 1},
      "observations": ["list"]}


def _environment(engine: Engine) -> tuple[str, str, str]:
    name = uid("env-")
    insert(engine, "environment", name=name, description="sorting", created_by="gov")
    ids = []
    for number, contract in ((1, V1), (2, V2)):
        version_id = uid("sha-")
        insert(engine, "environment_version", id=version_id, environment_name=name,
               version=number, contract=contract, contract_text=f"# v{number}",
               fixture_hashes={"list.json": "ab" * 32}, created_by="gov")
        ids.append(version_id)
    return name, ids[0], ids[1]


async def test_environment_versions_and_their_diff(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    name, v1, v2 = _environment(owner_engine)
    headers = people["auditor"].headers
    detail = (await api.get(f"/api/environments/{name}", headers=headers)).json()
    assert detail["version_count"] == 2 and [v["id"] for v in detail["versions"]] == [v2, v1]
    diff = (await api.get(f"/api/environments/{name}/diff?a=1&b=2", headers=headers)).json()
    changes = {(c["path"], c["kind"]) for c in diff["changes"]}
    assert changes == {("allowed_actions[1]", "removed"), ("observations", "added"),
                       ("reward.success", "changed")}
    same = (await api.get(f"/api/environments/{name}/diff?a=2&b=2", headers=headers)).json()
    assert same["changes"] == []
    assert_problem(await api.get(f"/api/environments/{name}/diff?a=1&b=9", headers=headers), 404)
    version = (await api.get(f"/api/environment-versions/{v1}", headers=headers)).json()
    assert version["contract"] == V1 and version["fixture_hashes"]["list.json"] == "ab" * 32
    listing = (await api.get("/api/environments?limit=200", headers=headers)).json()
    assert name in [e["name"] for e in listing["items"]]


async def test_tasks_show_admission_evidence(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    task_id = make_task(owner_engine, status="rejected")
    headers = people["engineer"].headers
    task = (await api.get(f"/api/tasks/{task_id}", headers=headers)).json()
    assert task["status"] == "rejected"
    listing = await api.get("/api/tasks", params={"environment_version_id":
                                                  task["environment_version_id"]},
                            headers=headers)
    assert [t["id"] for t in listing.json()["items"]] == [task_id]


async def test_eval_items_only_for_roles_that_may_read_them(
    api: httpx.AsyncClient, people: dict[str, Person], owner_engine: Engine
) -> None:
    eval_set = make_eval_set(owner_engine)
    insert(owner_engine, "eval_item", eval_set_id=eval_set, ordinal=0,
           task_id=make_task(owner_engine))
    threshold = uid("thr-")
    insert(owner_engine, "threshold", id=threshold, name=threshold, version=1,
           eval_set_id=eval_set, spec={"min_success_rate": 0.5}, created_by="gov")
    as_auditor = (await api.get(f"/api/eval-sets/{eval_set}",
                                headers=people["auditor"].headers)).json()
    assert as_auditor["item_count"] == 1 and len(as_auditor["items"]) == 1
    assert as_auditor["thresholds"][0]["spec"] == {"min_success_rate": 0.5}
    as_engineer = (await api.get(f"/api/eval-sets/{eval_set}",
                                 headers=people["engineer"].headers)).json()
    assert as_engineer["item_count"] == 1 and as_engineer["items"] is None
    one = await api.get(f"/api/thresholds/{threshold}", headers=people["engineer"].headers)
    assert one.json()["eval_set_id"] == eval_set
    listing = await api.get("/api/thresholds", params={"eval_set_id": eval_set},
                            headers=people["operator"].headers)
    assert [t["id"] for t in listing.json()["items"]] == [threshold]
    assert (await api.get("/api/eval-sets", headers=people["operator"].headers)).status_code == 200
